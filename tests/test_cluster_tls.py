"""A cluster whose Dask scheduler uses TLS: every pathways link is encrypted as well."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from _processes import wait_for_file
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.deploy._cli import main as cli
from pathways_nb.wire._addresses import parse_tcp

pytestmark = pytest.mark.slow
pytest.importorskip("cryptography")
from distributed.security import Security  # noqa: E402


@pytest.fixture(scope="module")
def secure() -> Iterator[pw.LocalCluster]:
    with pw.LocalCluster(islands=2, devices_per_island=2, security=True, dashboard=False) as c:
        yield c


def _pathways_addresses(client: pw.Client, *slices: pw.VirtualSlice) -> list[str]:
    return [client.controller_address, *(vs.data_address for vs in slices)]


def test_programs_puts_fetches_and_transfers_run_over_tls(secure: pw.LocalCluster) -> None:
    assert secure.scheduler_address.startswith("tls://")
    with pw.Client(secure) as client:
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        assert a.island != b.island
        addresses = _pathways_addresses(client, a, b)
        assert all(addr.startswith("tls://") for addr in addresses), addresses
        x_np = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
        x = a.put(x_np, P("x"))
        enc = pw.jit(lambda v: jnp.tanh(v / 100.0) * 2.0, slice=a)
        dec = pw.jit(lambda v: (v @ v.T).sum(0), slice=b, in_shardings=P(None, "x"))
        z = dec(enc(x))  # moves from a's host to b's, host to host
        h = np.tanh(x_np / 100.0) * 2.0
        np.testing.assert_allclose(np.asarray(z), (h @ h.T).sum(0), rtol=1e-5)
        client.wait_all()
        ev = client.events()
        done = ev[(ev.program == "transfer") & (ev.kind == "end")]
        assert len(done) == 1 and set(done.host) == {b.host}
        # A large array crosses intact both ways (frames decrypted in place on the host).
        big = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(b.put(big, P("x"))), big)


def _hello_frame() -> bytes:
    body = msgpack.packb({"t": "hello", "role": "client", "rid": 1})
    return b"PW" + struct.pack("<H", 1) + struct.pack("<Q", len(body)) + body


def _read_to_end(raw: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = raw.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return got
        if not chunk:
            return got
        got += chunk


def test_every_endpoint_shows_the_cluster_certificate_and_refuses_the_clear(
    secure: pw.LocalCluster,
) -> None:
    security = secure.security
    context = security.get_connection_args("client")["ssl_context"]
    expected = {
        ssl.PEM_cert_to_DER_cert(security.tls_scheduler_cert),
        ssl.PEM_cert_to_DER_cert(security.tls_worker_cert),
    }
    with pw.Client(secure) as client:
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        for address in _pathways_addresses(client, a, b):
            where = parse_tcp("tcp://" + address.removeprefix("tls://"))
            with (
                socket.create_connection(where, timeout=10) as raw,
                context.wrap_socket(raw) as tls,
            ):
                assert tls.getpeercert(binary_form=True) in expected
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
            # Our own framing in the clear gets no answer in it: a TLS alert at most.
            with socket.create_connection(where, timeout=10) as raw:
                raw.sendall(_hello_frame())
                answer = _read_to_end(raw)
                assert not answer.startswith(b"PW"), (address, answer[:16])
        # None of it disturbed the cluster.
        np.testing.assert_array_equal(np.asarray(a.put(np.ones(4, np.float32)) + 1), 2.0)


def test_a_client_without_the_cluster_certificates_is_refused(
    secure: pw.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", raising=False)
    with pytest.raises(ValueError, match=r"uses TLS, and no certificate was given.*security="):
        pw.Client(secure.scheduler_address)
    with pytest.raises(pw.BrokenError, match=secure.scheduler_address):
        pw.Client(secure.scheduler_address, security=Security.temporary(), timeout=5)
    # The cluster's own certificates, given with its address, are all a client needs.
    with pw.Client(secure.scheduler_address, security=secure.security) as client:
        vs = client.allocate({"x": 2})
        np.testing.assert_array_equal(np.asarray(vs.put(np.arange(4.0)) * 2), np.arange(4.0) * 2)


def test_a_client_takes_the_certificates_from_dask_configuration(
    secure: pw.LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = secure.logs_dir  # where the cluster keeps a client's files for its user
    files = {
        "distributed.comm.tls.ca-file": os.path.join(folder, "ca.pem"),
        "distributed.comm.tls.client.cert": os.path.join(folder, "client.pem"),
        "distributed.comm.tls.client.key": os.path.join(folder, "client-key.pem"),
    }
    with dask.config.set(files):
        with pw.Client(secure.scheduler_address, name="configured") as client:
            assert client.controller_address.startswith("tls://")
            vs = client.allocate({"x": 2})
            assert float(np.asarray(vs.put(np.ones(8, np.float32)).sum())) == 8.0
        # So does `pathways-nb status`, as an observer.
        assert cli(["status", secure.scheduler_address]) == 0
    assert f"cluster at {secure.scheduler_address}" in capsys.readouterr().out


def test_jupyterlab_panel_shows_a_local_cluster_with_tls(secure: pw.LocalCluster) -> None:
    from pathways_nb.lab._boards import Board, _connect, local_clusters

    found = [f for f in local_clusters() if f.address == secure.scheduler_address]
    assert len(found) == 1 and found[0].security() is not None
    board = Board(found[0], _connect)
    try:
        snap = board.snapshot()
        assert "error" not in snap, snap.get("error")
        assert snap["address"] == secure.scheduler_address and "2 islands" in snap["summary"]
    finally:
        board.close()


def test_the_cluster_command_runs_with_the_tls_files_given(tmp_path: Path) -> None:
    made = Security.temporary()
    files = {}
    for name, pem in (
        ("ca", made.tls_ca_file),
        ("cert", made.tls_client_cert),
        ("key", made.tls_client_key),
    ):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
    info_file = tmp_path / "cluster.json"
    cmd = [sys.executable, "-m", "pathways_nb.deploy._cli", "cluster", "--islands", "1"]
    cmd += ["--devices", "2", "--no-dashboard", "--scheduler-file", str(info_file)]
    cmd += ["--tls-ca-file", str(files["ca"]), "--tls-cert", str(files["cert"])]
    cmd += ["--tls-key", str(files["key"])]
    served = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        address = wait_for_file(info_file, served, 120)["address"]
        assert address.startswith("tls://")
        mine = Security(
            tls_ca_file=str(files["ca"]),
            tls_client_cert=str(files["cert"]),
            tls_client_key=str(files["key"]),
        )
        with pw.Client(address, security=mine) as client:
            assert client.controller_address.startswith("tls://")
            vs = client.allocate({"x": 2})
            assert vs.data_address.startswith("tls://")
            x = np.arange(8, dtype=np.float32)
            assert (
                np.asarray(pw.jit(jnp.cumsum)(vs.put(x, P("x")))).tolist() == np.cumsum(x).tolist()
            )
    finally:
        served.send_signal(signal.SIGINT)
        out = served.communicate(timeout=60)[0].decode()
    assert served.returncode == 0, out
    assert "security=Security(tls_ca_file=" in out


def test_a_killed_host_comes_back_over_tls() -> None:
    with (
        pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False, security=True) as c,
        pw.Client(c) as client,
    ):
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        st = client.status()
        victim = int(st.islands.set_index("host").loc[a.host, "process"].split(":")[-1])
        old_host = a.host
        os.kill(victim, signal.SIGKILL)
        # The nanny's new worker process starts its host with the worker's certificate
        # again: the lost slice comes back on it, reached over TLS.
        deadline = time.monotonic() + 90
        while a.host == old_host or a.state != "active":
            assert time.monotonic() < deadline, f"slice {a} not remapped"
            time.sleep(0.05)
        assert a.epoch == 1 and a.data_address.startswith("tls://")
        x = a.put(np.arange(4, dtype=np.float32), P("x"))
        moved = pw.jit(lambda v: v * 3, slice=b)(x + 1)
        np.testing.assert_array_equal(np.asarray(moved), (np.arange(4) + 1) * 3)


def test_the_cluster_command_makes_certificates_a_scheduler_file_hands_to_clients(
    tmp_path: Path,
) -> None:
    from pathways_nb._magics import Session

    info_file = tmp_path / "cluster.json"
    cmd = [sys.executable, "-m", "pathways_nb.deploy._cli", "cluster", "--islands", "1"]
    cmd += ["--devices", "2", "--no-dashboard", "--scheduler-file", str(info_file), "--tls"]
    served = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        info = wait_for_file(info_file, served, 120)
        assert info["address"].startswith("tls://")
        assert set(info["tls"]) == {"tls_ca_file", "tls_client_cert", "tls_client_key"}
        with pw.Client(scheduler_file=info_file) as client:
            vs = client.allocate({"x": 2})
            np.testing.assert_array_equal((vs.put(np.ones(2)) * 3).fetch(), [3.0, 3.0])
        notebook = Session()  # %pathways connect FILE: the same
        assert notebook.connect(str(info_file)).controller_address.startswith("tls://")
        notebook.stop()
    finally:
        served.send_signal(signal.SIGINT)
        out = served.communicate(timeout=60)[0].decode()
    assert served.returncode == 0, out
    assert "tls_client_key=" in out  # the connect line it printed names the files


def test_plain_jax_reaches_a_cluster_with_tls_through_the_proxy_use_jax_starts(
    secure: pw.LocalCluster, tmp_path: Path
) -> None:
    from pathways_nb.proxy._kernel import ProxyProcess

    proxy = ProxyProcess(secure.scheduler_address, "tls-jax", 1.0, secure.security)
    folder = proxy._folder
    try:
        assert folder is not None and (os.stat(folder).st_mode & 0o077) == 0
        script = tmp_path / "plain.py"
        script.write_text(
            "import pathwaysutils; pathwaysutils.initialize()\n"
            "import jax, jax.numpy as jnp, numpy as np\n"
            "x = jax.device_put(np.arange(8.0, dtype=np.float32))\n"
            "print('VALUE', float(jax.jit(lambda v: (v * 2).sum())(x)))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(
            JAX_PLATFORMS="proxy",
            JAX_BACKEND_TARGET=proxy.target,
            IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS="true",
        )
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
        )
        assert out.returncode == 0, out.stderr[-4000:]
        assert "VALUE 56.0" in out.stdout
    finally:
        proxy.stop()
    assert not os.path.exists(folder)  # the certificate files went with the proxy
