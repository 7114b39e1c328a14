"""Real processes: a Dask scheduler hosting the controller, one Dask worker per island."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import psutil
import pytest
from _processes import gone, wait_for_file
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.deploy._cli import main as cli
from pathways_nb.deploy._demo import init_params, make_data, train_step
from pathways_nb.wire._addresses import dial
from pathways_nb.wire._stream import StreamDealer
from pathways_nb.worker._profiles import folder_name

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local() -> Iterator[pw.LocalCluster]:
    with pw.LocalCluster(islands=2, devices_per_island=4) as c:
        yield c


def _cluster_pids(parent: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("PATHWAYS_PARENT_PID") == str(parent) and p.pid != parent:
                out.append(p.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def test_training_over_a_scheduler_address_matches_plain_jax(local: pw.LocalCluster) -> None:
    with pw.Client(local.scheduler_address) as client:
        st = client.status()
        assert len(st.islands) == 2 and set(st.islands.devices) == {4}
        # The controller runs in the scheduler's process, never in ours.
        assert all(str(os.getpid()) != p.split(":")[-1] for p in st.islands.process)
        vs = client.allocate({"data": 4})
        sizes = (16, 64, 4)
        x_np, y_np = make_data(128, sizes[0], sizes[-1])
        params = {k: vs.put(v, P()) for k, v in init_params(sizes).items()}
        x, y = vs.put(x_np, P("data")), vs.put(y_np, P("data"))
        step = pw.jit(train_step, donate_argnums=0)
        losses = []
        for _ in range(20):
            params, loss = step(params, x, y)
            losses.append(loss)
        got = [float(v) for v in pw.fetch(losses)]
        ref_step = jax.jit(train_step)
        ref_params = jax.tree.map(jnp.asarray, init_params(sizes))
        ref = []
        for _ in range(20):
            ref_params, ref_loss = ref_step(ref_params, x_np, y_np)
            ref.append(float(ref_loss))
        np.testing.assert_allclose(got, ref, rtol=1e-5)
        final = pw.fetch(params)
        for k in final:
            np.testing.assert_allclose(final[k], ref_params[k], rtol=1e-4, atol=1e-6)


def test_a_client_with_64_bit_types_keeps_them_on_the_hosts(local: pw.LocalCluster) -> None:
    """With jax_enable_x64 the client puts and traces float64 and int64 arrays: hosts
    hold and run them as they are (they held float64 puts as float32, silently)."""
    v = np.arange(8.0) / 3

    def f(a: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.sin(a) * 1e-12 + a, i * 3_000_000_000

    with pw.Client(local.scheduler_address) as client, jax.enable_x64(True):
        vs = client.allocate({"data": 2})
        x = vs.put(v, P("data"))
        i = vs.put(np.arange(8), P("data"))
        assert (x.dtype, i.dtype) == (np.float64, np.int64)
        np.testing.assert_array_equal(np.asarray(x), v)
        got = pw.fetch(pw.jit(f)(x, i))
        want = jax.jit(f)(v, np.arange(8))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, np.asarray(w))
        # A 32-bit client of the same hosts still gets its 32-bit arrays.
    with pw.Client(local.scheduler_address) as client:
        vs = client.allocate({"data": 2})
        y = pw.jit(lambda a: a * 2)(vs.put(v, P("data")))
        assert y.dtype == np.float32 and np.asarray(y).dtype == np.float32


def test_jax_debug_nans_in_the_client_checks_outputs_on_the_hosts(
    local: pw.LocalCluster,
) -> None:
    """The flag lives in the notebook's process; the hosts check the launches it marks
    (they checked nothing: NaN flowed on as if the flag were off)."""
    with pw.Client(local.scheduler_address) as client:
        vs = client.allocate({"data": 2})
        x = vs.put(np.arange(4, dtype=np.float32), P("data"))
        with jax.debug_nans(True):
            y = pw.jit(lambda a: jnp.log(a - 2.0), name="shifted_log")(x)
            z = y + 1
        unchecked = pw.jit(lambda a: jnp.log(a - 2.0))(x)
        with pytest.raises(FloatingPointError, match=r"output 0 .* holds NaN") as info:
            z.fetch()
        assert isinstance(info.value, pw.NonFiniteError)
        assert info.value.program == "shifted_log" and info.value.host == vs.host
        assert np.isnan(unchecked.fetch()).sum() == 2


def test_arrays_move_between_host_processes(local: pw.LocalCluster) -> None:
    with pw.Client(local) as client:
        a = client.allocate({"x": 4})
        b = client.allocate({"y": 2, "z": 2})
        assert a.island != b.island
        x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
        xa = a.put(x, P("x"))
        to_b = pw.jit(lambda v: v * 1.0, slice=b, in_shardings=P("z", "y"))
        back = pw.jit(lambda v: v - 1.0, slice=a, in_shardings=P(None, "x"))
        np.testing.assert_array_equal(np.asarray(back(to_b(xa))), x - 1.0)
        client.wait_all()  # the transfers' ends are logged once acknowledged
        ev = client.events()
        done = ev[(ev.program == "transfer") & (ev.kind == "end")]
        assert len(done) == 2 and set(done.host) == {a.host, b.host}
        assert all(f"{x.nbytes} B" in d for d in done.detail)


def test_as_completed_takes_programs_on_two_host_processes_as_they_finish(
    local: pw.LocalCluster,
) -> None:
    with pw.Client(local) as client:
        a = client.allocate({"x": 4})
        b = client.allocate({"x": 4})
        assert a.host != b.host
        client.inject_fault(a, match="slow", kind="delay:1.0")
        x = np.arange(16, dtype=np.float32)
        slow = pw.jit(lambda v: v * 2.0, name="slow")(a.put(x, P("x")))
        fast = pw.jit(lambda v: v + 2.0, name="fast")(b.put(x, P("x")))
        order = list(pw.as_completed([slow, fast]))
        assert order[0] is fast and order[1] is slow
        np.testing.assert_array_equal(slow.fetch(), x * 2.0)
        np.testing.assert_array_equal(fast.fetch(), x + 2.0)


def test_a_checkpoint_is_written_and_read_by_the_host_processes(
    local: pw.LocalCluster, tmp_path: Path
) -> None:
    with pw.Client(local) as client:
        a = client.allocate({"x": 4})
        b = client.allocate({"x": 2, "y": 2})
        assert a.host != b.host
        x = np.arange(64, dtype=np.float32).reshape(8, 8)
        state = {"w": pw.jit(lambda v: v * 3.0)(a.put(x, P("x"))), "key": a.put(jax.random.key(1))}
        assert sorted(pw.save(tmp_path, state)) == ["key.npy", "w.npy"]
        np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), x * 3.0)
        back = pw.restore(tmp_path, state, slice=b)
        assert back["w"].slice is b and back["w"].spec == P("x")
        np.testing.assert_array_equal(back["w"].fetch(), x * 3.0)
        np.testing.assert_array_equal(
            jax.random.key_data(back["key"].fetch()), jax.random.key_data(jax.random.key(1))
        )


def test_colocated_functions_run_in_the_host_processes(
    local: pw.LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pw.Client(local) as client:
        a = client.allocate({"x": 4})
        b = client.allocate({"x": 4})
        x = np.arange(32, dtype=np.float32).reshape(8, 4)
        xa = a.put(x, P("x"))
        # Defined here, it travels by value; it runs in the host's process, not this one.
        where = pw.colocated(
            lambda v, k: (os.getpid(), np.asarray(v) * k),
            out=lambda v, k: (jax.ShapeDtypeStruct((), np.int32), v),
        )
        pid_a, ya = where(xa, 2.0)
        pid_b, yb = where(b.put(x, P("x")), 3.0)
        hosts = {int(p.rsplit(":", 1)[1]) for p in client.status().islands.process}
        assert {int(pid_a), int(pid_b)} == hosts and os.getpid() not in hosts
        np.testing.assert_array_equal(ya.fetch(), x * 2.0)
        np.testing.assert_array_equal(yb.fetch(), x * 3.0)
        # A function from a module the hosts cannot import goes by reference, and says so.
        (tmp_path / "only_here.py").write_text("def double(v):\n    return v * 2\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        import only_here  # type: ignore[import-not-found]

        r = pw.colocated(only_here.double, out=lambda v: v)(xa)
        with pytest.raises(pw.RemoteError, match="install that module on the hosts") as info:
            r.fetch()
        assert "only_here" in str(info.value) and info.value.host == a.host
        np.testing.assert_array_equal(where(xa, 1.0)[1].fetch(), x)  # the host goes on


def test_each_host_process_profiles_itself_and_the_traces_share_one_time_axis(
    local: pw.LocalCluster, tmp_path: Path
) -> None:
    with pw.Client(local) as client, pw.Client(local, name="other") as other:
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        assert a.host != b.host
        x = a.put(np.ones((256, 256), np.float32), P("x"))
        enc = pw.jit(lambda v: jnp.tanh(v @ v.T), slice=a, name="encode")
        dec = pw.jit(lambda v: v.sum(), slice=b, name="decode")
        float(dec(enc(x)))
        with client.profile(tmp_path) as prof:
            out = [dec(enc(x)) for _ in range(3)]
        assert all(o.is_ready() for o in out)
        assert sorted(t.host for t in prof.hosts) == sorted([a.host, b.host])
        for t in prof.hosts:
            assert t.folder == str(tmp_path / folder_name(t.host)) and t.why == "stopped"
            assert any(p.endswith(".xplane.pb") and os.path.getsize(p) for p in t.files)
            assert t.events
        doc = pw.viz.trace_events(client.events(since=prof.started), profile=prof)
        for t in prof.hosts:
            # Each host's XLA work lies within its own session, which lies within the
            # client's profile: the clocks of the processes agree.
            pids = {
                e["pid"]
                for e in doc["traceEvents"]
                if e.get("name") == "process_name" and f"host {t.host} XLA" in e["args"]["name"]
            }
            xla = [e for e in doc["traceEvents"] if e["pid"] in pids and e.get("ph") == "X"]
            assert xla
            assert all(t.started * 1e6 - 1e3 <= e["ts"] <= t.ended * 1e6 + 1e3 for e in xla)
        runs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] < 1000]
        assert {"encode", "decode"} <= {e["name"] for e in runs}

        # A client one of whose hosts is profiled for another is refused, and its
        # other host, which had started, stops again.
        theirs = {s.host: s for s in (other.allocate({"x": 2}), other.allocate({"x": 2}))}
        assert set(theirs) == {a.host, b.host}
        held = client.profile(tmp_path / "held", slices=a).start()
        with pytest.raises(pw.RemoteError, match="profiled for another client"):
            other.profile(tmp_path / "other").start()
        with other.profile(tmp_path / "other", slices=theirs[b.host]) as mine:
            pass
        assert [t.host for t in mine.hosts] == [b.host]
        held.stop()


def test_dask_arrays_are_computed_in_their_hosts_worker_process(local: pw.LocalCluster) -> None:
    import dask.array as da

    with pw.Client(local) as client:
        assert client.dask_client.scheduler.address == local.scheduler_address
        st = client.status()
        for vs in (client.allocate({"data": 4}), client.allocate({"data": 4})):
            pid = int(st.islands.set_index("island").process[vs.island].split(":")[-1])
            # Each value is the process id of whoever computed its chunk.
            pids = da.zeros((16, 2), np.int32, chunks=4).map_blocks(
                lambda b: np.full(b.shape, os.getpid(), np.int32), dtype=np.int32
            )
            np.testing.assert_array_equal(vs.put(pids, P("data")).fetch(), np.full((16, 2), pid))
            xs = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
            got = [
                b.fetch() for b in pw.data.batches(da.from_array(xs, chunks=8), vs, batch_size=8)
            ]
            np.testing.assert_array_equal(np.concatenate(got), xs)
        client.wait_all(10)
        assert client.pending() == 0


def test_arrays_of_every_size_cross_processes_and_come_back_read_only(
    local: pw.LocalCluster,
) -> None:
    """Arrays of every size between real processes: puts and transfers above the
    stream's aligned-frame size (placed from the received bytes themselves) give the
    same values as small ones, a program that donates one gives the right result, and
    fetched values are read-only as ``np.asarray`` of a ``jax.Array`` is."""
    with pw.Client(local) as client:
        a = client.allocate({"x": 4})
        b = client.allocate({"x": 2, "y": 2})
        rng = np.random.default_rng(3)
        for rows in (4, 256, 2048):  # 2 KiB, 128 KiB, 1 MiB
            x = rng.standard_normal((rows, 128)).astype(np.float32)
            xa = a.put(x, P("x"))
            moved = pw.jit(lambda v: v, slice=b, in_shardings=P("x", "y"))(xa)
            doubled = pw.jit(lambda v: v * 2, donate_argnums=0)(moved)
            got = {"put": xa.fetch(), "moved": pw.jit(lambda v: v + 0, slice=b)(xa).fetch()}
            got["doubled"] = doubled.fetch()
            np.testing.assert_array_equal(got["put"], x)
            np.testing.assert_array_equal(got["moved"], x)
            np.testing.assert_array_equal(got["doubled"], 2 * x)
            assert not any(v.flags.writeable for v in got.values()), rows
            assert np.array(xa).flags.writeable
        # All sizes at once from both host processes, with more arrays than one request
        # carries: each host answers in parts of at most 512.
        values = [rng.standard_normal((rows, 128)).astype(np.float32) for rows in (0, 4, 2048)]
        values += [np.full(3, i, np.int32) for i in range(600)]
        tree = [(a if i % 3 else b).put(v) for i, v in enumerate(values)]
        assert pw.block_until_ready(tree) is tree
        for v, g in zip(values, pw.fetch(tree), strict=True):
            assert g.dtype == v.dtype and not g.flags.writeable
            np.testing.assert_array_equal(g, v)


def test_an_interrupt_in_the_middle_of_a_large_fetch_leaves_the_client_usable(
    local: pw.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C may come between a receive of a large answer and the count of what it
    took: the connection is then dropped, and the next fetch from that host works."""
    from pathways_nb.wire import _stream

    advance = _stream._Conn._advance
    interrupted = threading.Event()

    def interrupt_once(conn: Any, n: int, msgs: list[Any]) -> None:
        if not interrupted.is_set() and conn._frames is not None and n:
            interrupted.set()
            raise KeyboardInterrupt  # as a signal handler would, with n bytes unaccounted
        advance(conn, n, msgs)

    monkeypatch.setattr(_stream._Conn, "_advance", interrupt_once)
    out: dict[str, Any] = {}

    def fetches() -> None:
        try:
            big.fetch()
        except KeyboardInterrupt:
            out["interrupted"] = True
        out["small"] = small.fetch()
        out["big"] = big.fetch()

    with pw.Client(local) as client:
        vs = client.allocate({"x": 4})
        big = vs.put(np.arange(1 << 22, dtype=np.float32), P("x"))  # 16 MiB
        small = vs.put(np.arange(8, dtype=np.float32), P("x"))
        pw.block_until_ready([big, small])
        t = threading.Thread(target=fetches, daemon=True)  # thread-local connections
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "a fetch after the interrupt never finished"
        assert out["interrupted"]
        np.testing.assert_array_equal(out["small"], np.arange(8, dtype=np.float32))
        np.testing.assert_array_equal(out["big"], np.arange(1 << 22, dtype=np.float32))


def test_ctrl_c_during_a_burst_of_launches_leaves_nothing_half_done(
    local: pw.LocalCluster,
) -> None:
    """Interrupts land at any point of a submission loop (most often right after a
    send returns): each launch is then either whole (waited for, sent once, its outputs
    made) or not begun, so waits end and the controller counts what the client does."""
    import _thread
    import random

    rng = random.Random(0)
    with pw.Client(local) as client:
        vs = client.allocate({"x": 4})
        inc = pw.jit(lambda v: v + 1, name="inc")
        for _ in range(12):
            x = vs.put(np.zeros(8, np.float32), P("x"))
            caught = threading.Event()

            def interrupt(after: float, caught: threading.Event = caught) -> None:
                # Again until one lands: a KeyboardInterrupt raised inside a garbage
                # collector's callback (JAX has one) is swallowed there.
                while not caught.wait(after):
                    _thread.interrupt_main()
                    after = 0.02

            timer = threading.Thread(target=interrupt, args=(rng.uniform(0.01, 0.08),))
            timer.start()
            calls = 0
            try:
                while True:
                    x = inc(x)
                    calls += 1
            except KeyboardInterrupt:
                caught.set()
            timer.join()
            np.testing.assert_array_equal(x.fetch(), np.full(8, calls, np.float32))
            client.wait_all(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tenants = client.status().tenants
            if int(tenants.set_index("tenant").loc[client.tenant, "pending"]) == 0:
                break
            time.sleep(0.05)
        assert int(tenants.set_index("tenant").loc[client.tenant, "pending"]) == 0


def _thread_nices(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        out[int(tid)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


def test_hosts_run_xla_threads_below_the_control_plane(local: pw.LocalCluster) -> None:
    with pw.Client(local) as client:
        vs = client.allocate({"d": 4})
        x = vs.put(np.arange(8, dtype=np.float32), P("d"))
        np.testing.assert_array_equal(np.asarray(pw.jit(lambda v: v * 3.0)(x)), np.arange(8) * 3.0)
        row = client.status().islands.set_index("island").loc[vs.island]
        pid = int(row.process.rsplit(":", 1)[1])
    nices = _thread_nices(pid)
    assert nices[pid] == 0  # the worker's main thread: Dask's event loop
    # XLA's pools (at least a thread per device) yield; the host's Python threads do not.
    assert sum(n == pw.Config().cpu_device_nice for n in nices.values()) >= 4
    assert sum(n == 0 for n in nices.values()) >= 4
    assert set(nices.values()) == {0, pw.Config().cpu_device_nice}
    # The same threads, and only they, run under SCHED_IDLE.
    policies = {}
    for tid in nices:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            policies[tid] = os.sched_getscheduler(tid)
    lowered = {t for t, n in nices.items() if n == pw.Config().cpu_device_nice}
    assert {policies[t] for t in lowered if t in policies} == {os.SCHED_IDLE}
    assert os.SCHED_IDLE not in {p for t, p in policies.items() if t not in lowered}


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_hosts_map_large_buffers_with_huge_pages(local: pw.LocalCluster) -> None:
    """A buffer above glibc's mmap threshold is a fresh mapping at every run; the host's
    process maps it with huge pages, so writing it costs tens of page faults, not one
    per 4 KiB (which made a large program's run several times its arithmetic)."""
    with pw.Client(local) as client:
        vs = client.allocate({"d": 1})
        row = client.status().islands.set_index("island").loc[vs.island]
        pid = int(row.process.rsplit(":", 1)[1])
        assert "glibc.malloc.hugetlb=1" in psutil.Process(pid).environ()["GLIBC_TUNABLES"]
        x = vs.put(np.arange(4096, dtype=np.float32))
        big = pw.jit(lambda v: jnp.broadcast_to(v, (2560, 4096)) * 2.0)  # 40 MiB out
        big(x).block_until_ready()  # compiled, and the first mapping made
        before = _minor_faults(pid)
        outs = [big(x) for _ in range(3)]
        pw.block_until_ready(outs)
        per_run = (_minor_faults(pid) - before) / 3
        np.testing.assert_array_equal(outs[2][2559, :4].fetch(), np.arange(4) * 2.0)
        vs.release()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("this kernel gives no transparent huge pages")
    assert per_run < (40 << 20) / 4096 / 4, per_run  # ~10,000 with 4 KiB pages


def test_tcp_garbage_is_answered_and_the_cluster_keeps_serving(local: pw.LocalCluster) -> None:
    address = local.controller_address
    # Well-framed junk gets an error reply on the same connection.
    sock = StreamDealer(address, blocking=True)
    for frames in ([b"\x00junk"], [msgpack.packb({"t": "launch"})]):
        sock.send_multipart(frames)
        assert sock.poll(10_000)
        assert msgpack.unpackb(bytes(sock.recv_multipart()[0]))["t"] == "error"
    sock.close()
    # Bytes that are not our framing at all (here a ZeroMQ peer's greeting, then an HTTP
    # request) close that connection and only that one.
    for junk in (b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f", b"GET / HTTP/1.1\r\n\r\n"):
        with dial(address, 10) as raw:
            raw.sendall(junk)
            assert raw.recv(1) == b""
    with pw.Client(local) as client:
        vs = client.allocate({"data": 2})
        np.testing.assert_array_equal(
            (vs.put(np.ones(2, np.float32), P("data")) * 2).fetch(), np.full(2, 2.0, np.float32)
        )


def test_killed_host_gives_data_loss_and_the_nanny_brings_it_back(tmp_path: Path) -> None:
    import dask.array as da

    cache = tmp_path / "xla-cache"
    env = {"PATHWAYS_COMPILATION_CACHE": str(cache)}
    with (
        pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False, env=env) as c,
        pw.Client(c) as client,
    ):
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        xa = a.put(np.ones(2, np.float32), P("x"))
        xb = b.put(np.ones(2, np.float32), P("x"))
        rows = np.arange(48, dtype=np.float32).reshape(24, 2)
        batches = pw.data.batches(da.from_array(rows, chunks=4), a, batch_size=4, prefetch=2)
        got = [next(batches).fetch()]  # two more are put on the host ahead of the loop
        st = client.status()
        victim = int(st.islands.set_index("host").loc[a.host, "process"].split(":")[-1])
        old_host = a.host
        prof = client.profile(tmp_path / "prof").start()  # on both hosts
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(pw.DataLossError):
            (xa + 1).fetch()
        # The lost host's profile is a failure; the other host's trace is kept.
        with pytest.raises((pw.BrokenError, pw.DataLossError)):
            prof.stop()
        assert [t.host for t in prof.hosts] == [b.host] and prof.hosts[0].events
        # Lost, or already remapped: the nanny may restart the worker before the error
        # that the controller learns of with the worker's removal reaches the client.
        assert a.state == "lost" or (a.epoch == 1 and a.host != old_host)
        np.testing.assert_array_equal((xb + 1).fetch(), np.full(2, 2.0, np.float32))
        c.wait_for_hosts(2, timeout=60)
        # The restarted host takes the lost slice back: the same object runs again, on
        # the new process's devices, and what it held before stays lost.
        assert a.wait_active(timeout=60) is a and a.epoch == 1 and a.host != old_host
        assert a.island == client.status().slices.set_index("slice").loc[a.id, "island"]
        events = client.events()
        assert old_host in set(events[events.kind == "host_lost"].host)
        assert a.host in set(events[events.kind == "remap"].host)
        with pytest.raises(pw.DataLossError, match="remapped onto host"):
            xa.fetch()
        np.testing.assert_array_equal(
            (a.put(np.ones(2), P("x")) + 1).fetch(), np.full(2, 2.0, np.float32)
        )
        moved = pw.jit(lambda v: v * 3, slice=b)(a.put(np.ones(2, np.float32), P("x")))
        np.testing.assert_array_equal(moved.fetch(), np.full(2, 3.0, np.float32))
        # The batches lost with the host are computed again on the new one.
        got += [batch.fetch() for batch in batches]
        np.testing.assert_array_equal(np.concatenate(got), rows)
    # Hosts keep a persistent compilation cache, so a restarted host compiles nothing twice.
    assert cache.is_dir() and any(cache.iterdir())


_DOOMED_CLIENT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import pathways_nb as pw
    from jax.sharding import PartitionSpec as P

    client = pw.Client(sys.argv[1], name="doomed")
    vs = client.allocate({"x": 4}, name="doomed-slice")
    x = vs.put(np.ones((64, 64), np.float32), P("x"))
    f = pw.jit(lambda v: (v @ v.T) * 1e-3)
    x = f(x)
    x.block_until_ready()
    client.profile(sys.argv[2]).start()  # the host stops it when this process dies
    print("running", flush=True)
    while True:
        for _ in range(16):
            x = f(x)
        x.block_until_ready()
    """
)


def test_a_burst_of_chained_launches_and_puts_after_deletions_fit_a_store_quota() -> None:
    """``x = f(x)`` in a loop drops each array as the next launch takes it. Those
    deletions leave with the launches once they add up (not on the client IO thread's
    next turn, up to 50 ms later), so the host never keeps the whole burst's arrays: a
    store quota of a dozen arrays carries a burst of 64 launches."""
    env = {"PATHWAYS_TENANT_STORE_BYTES": str(3 * 2**20)}
    with (
        pw.LocalCluster(islands=1, devices_per_island=2, dashboard=False, env=env) as c,
        pw.Client(c) as client,
    ):
        vs = client.allocate({"x": 2})
        m0 = np.eye(256, dtype=np.float32) * 0.5  # 256 KiB
        step = pw.jit(lambda m: jnp.tanh(m @ m + 0.1), name="step")
        m = vs.put(m0, P("x"))
        for _ in range(64):
            m = step(m)
        expected = m0
        for _ in range(64):
            expected = np.tanh(expected @ expected + 0.1)
        np.testing.assert_allclose(m.fetch(), expected, rtol=1e-5, atol=1e-6)
        # A put that fits only once a deletion just made is done: it reaches the host
        # first (the deletion goes through the controller) and waits for it there.
        for i in range(3):
            big = vs.put(np.zeros(704 * 1024, np.float32), P("x"))  # 2.75 MiB, with m 3
            big.block_until_ready()
            big.delete()
            small = vs.put(np.full(128 * 1024, i, np.float32), P("x"))  # 0.5 MiB
            np.testing.assert_array_equal(small.fetch()[:4], i)
            small.delete()


def test_a_killed_client_process_frees_its_slices_at_once(
    local: pw.LocalCluster, tmp_path: Path
) -> None:
    """A client whose process dies (SIGKILL: no goodbye) loses its slices as soon as its
    connection closes, not when its lease lapses (30 s); another tenant's work goes on
    and can take the freed devices, and profile their host, which stopped the dead
    client's profile."""
    doomed = subprocess.Popen(
        [sys.executable, "-c", _DOOMED_CLIENT, local.scheduler_address, str(tmp_path / "d")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert doomed.stdout is not None and doomed.stdout.readline().strip() == "running"
        with pw.Client(local, name="survivor") as client:
            vs = client.allocate({"x": 4})
            y = vs.put(np.arange(4, dtype=np.float32), P("x"))
            inc = pw.jit(lambda v: v + 1)
            st = client.status()
            assert "doomed" in set(st.tenants.name)
            island = st.slices.set_index("name").loc["doomed-slice", "island"]
            with pytest.raises(pw.BusyError):
                client.allocate({"x": 4})  # both islands are held
            doomed.kill()
            doomed.wait(10)
            for _ in range(20):
                y = inc(y)
            deadline = time.monotonic() + 10.0  # well inside the 30 s lease
            while "doomed" in set(client.status().tenants.name):
                assert time.monotonic() < deadline, "the dead client still holds its slices"
                time.sleep(0.05)
            taken = client.allocate({"x": 4})
            assert taken.island == island
            np.testing.assert_array_equal(np.asarray(y), np.arange(4) + 20.0)
            np.testing.assert_array_equal((taken.put(np.ones(4), P("x")) * 3).fetch(), 3.0)
            while True:  # once the host has seen the dead client's connection close
                try:
                    prof = client.profile(tmp_path / "s", slices=taken).start()
                    break
                except pw.RemoteError as exc:
                    assert exc.kind == "busy" and time.monotonic() < deadline, exc
                    time.sleep(0.05)
            prof.stop()
            assert [t.host for t in prof.hosts] == [taken.host]
            # The host ended the dead client's profile, and XLA wrote its trace.
            assert list((tmp_path / "d" / folder_name(taken.host)).rglob("*.xplane.pb"))
            events = client.events(all_tenants=True)
            leave = events[events.kind == "tenant_leave"]
            assert "its connection closed" in set(leave.detail)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)


def test_a_dead_controller_is_a_clear_error_not_a_hang() -> None:
    """The scheduler process (and so the controller) killed under a client: a wait in
    progress and every later call raise BrokenError saying the controller went away;
    closing the client and the cluster still works."""
    with pw.LocalCluster(islands=1, devices_per_island=2, dashboard=False) as c:
        client = pw.Client(c)
        vs = client.allocate({"x": 2})
        x = vs.put(np.ones(4, np.float32), P("x"))
        f = pw.jit(lambda v: v + 1)
        np.testing.assert_array_equal(f(x).fetch(), 2.0)
        # Its host holds this launch for 5 s: waiting for it outlasts the controller.
        client.inject_fault(vs, match="slow", kind="delay:5")
        slow = pw.jit(lambda v: v * 2, name="slow")(x)
        waited: list[BaseException] = []

        def wait() -> None:
            try:
                slow.block_until_ready()
            except BaseException as exc:  # what the wait ended with
                waited.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        t0 = time.monotonic()
        os.kill(c.scheduler_pid, signal.SIGKILL)
        waiter.join(30)
        assert not waiter.is_alive(), "the wait did not end when the controller died"
        # Two signals race: the client sees the controller's connection close, and the
        # host (a Dask worker whose scheduler died) shuts down and fails what waits on it.
        assert len(waited) == 1, waited
        if isinstance(waited[0], pw.DataLossError):
            assert "shut down" in str(waited[0]), waited
        else:
            assert isinstance(waited[0], pw.BrokenError), waited
            assert "controller" in str(waited[0]) and "went away" in str(waited[0])
        assert time.monotonic() - t0 < 5.0  # not the delayed launch finishing
        deadline = time.monotonic() + 10
        while not client.closed and client._io.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)
        calls = (lambda: f(x), x.fetch, client.status, lambda: client.allocate({"x": 1}))
        for call in calls:
            with pytest.raises(pw.BrokenError, match=r"controller at .* went away"):
                call()
        client.close()


def test_start_twice_close_twice_leaves_no_processes() -> None:
    before = set(_cluster_pids(os.getpid()))
    first = pw.LocalCluster(islands=1, devices_per_island=1, dashboard=False)
    second = pw.LocalCluster(islands=1, devices_per_island=1, dashboard=False)
    assert first.scheduler_address != second.scheduler_address
    pids = sorted(set(_cluster_pids(os.getpid())) - before)
    assert len(pids) >= 6  # per cluster: scheduler, nanny, worker
    for c in (first, second):
        c.close()
        c.close()
    assert gone(pids, 30), f"still running: {pids}"


def test_a_host_that_cannot_start_fails_the_cluster_at_once_naming_why() -> None:
    """A worker whose host cannot start (here JAX has no such platform) closes itself,
    and the cluster says why within seconds, where it waited for its whole timeout."""
    before = set(_cluster_pids(os.getpid()))
    t0 = time.monotonic()
    with pytest.raises(pw.BrokenError) as info:
        pw.LocalCluster(
            islands=1,
            devices_per_island=1,
            dashboard=False,
            platform=None,
            env={"JAX_PLATFORMS": "no_such_platform"},
            timeout=120,
        )
    assert time.monotonic() - t0 < 60
    message = str(info.value)
    first = message.splitlines()[0]
    assert "the Dask worker of island0 exited" in first
    assert "Unable to initialize backend 'no_such_platform'" in first
    # Waiting for the hosts no longer fills the scheduler's log with the probes'
    # connections, which left no room there for anything else.
    assert "closed before handshake" not in message
    assert gone(sorted(set(_cluster_pids(os.getpid())) - before), 30)


def test_a_killed_kernel_leaves_no_orphans(tmp_path: object) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        import pathways_nb as pw
        c = pw.LocalCluster(islands=1, devices_per_island=1, dashboard=False)
        print(c.logs_dir, flush=True)
        time.sleep(600)
        """
    )
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert kernel.stdout is not None
    logs = Path(kernel.stdout.readline().decode().strip())
    assert (logs / "scheduler.log").exists()
    pids = _cluster_pids(kernel.pid)
    assert len(pids) >= 3
    kernel.kill()
    kernel.wait()
    assert gone(pids, 40), f"orphans: {pids}"
    # Nor its logs' folder, which the dead kernel could not remove.
    assert not logs.exists()


def test_preload_modules_import_no_client_pandas_or_ipython() -> None:
    code = textwrap.dedent(
        """
        import sys
        import pathways_nb.deploy.scheduler
        bad = [m for m in ("jax", "pandas", "IPython", "pathways_nb.client") if m in sys.modules]
        assert not bad, bad
        import pathways_nb.deploy.worker
        import pathways_nb
        bad = [m for m in ("pandas", "IPython", "pathways_nb.client") if m in sys.modules]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_benchmark_runs_quick_and_writes_json_a_plot_and_the_table(tmp_path: Path) -> None:
    """``python -m benchmarks --quick``: a smoke run that keeps the suite from rotting
    (benchmarks are not tests: no timing is asserted here)."""
    subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    names = {
        "dispatch",
        "size",
        "training",
        "core",
        "mpmd",
        "widgets",
        "memory",
        "scale",
        "fetch",
        "data",
        "tls",
        "profile",
        "colocated",
        "proxy",
    }
    assert set(summary["experiments"]) == names
    for name in names:
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["benchmark"] == name and "machine" in result
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    dispatch = json.loads((tmp_path / "dispatch.json").read_text())
    # Ray and ipyparallel have columns where installed (pip install .[bench]), else a reason.
    assert {"pathways_nb", "jax", "dask_actors"} <= set(dispatch["programs_per_s"])
    assert set(dispatch["programs_per_s"]) | set(dispatch["skipped"]) == {
        "pathways_nb",
        "jax",
        "dask_actors",
        "ray_actors",
        "ipyparallel",
    }
    mpmd = json.loads((tmp_path / "mpmd.json").read_text())
    assert set(mpmd["pipeline"]["bubble_per_stage"]) == {"0", "1", "2", "3"}
    assert mpmd["pipeline_wide"]["params"]["width"] > mpmd["pipeline"]["params"]["width"]
    exact = mpmd["pipeline"]["reduce_grads_every_microbatch"]
    assert (
        exact["ratio"] > 0 and len(exact["ratio_per_round"]) == mpmd["pipeline"]["params"]["rounds"]
    )
    assert mpmd["pipeline"]["params"]["extra_warmup"] == 1
    assert mpmd["pipeline"]["standard_1f1b"]["bubble_ratio"] > 0
    chained = json.loads((tmp_path / "core.json").read_text())["chained"]
    assert chained["lean_path_ratio"] > 0
    assert set(chained["cpu_us_per_call"]) == {"plain_jax", "pathways", "lean_path"}
    cores = chained["core_us_per_call"]
    assert set(cores) == {"plain_jax", "pathways", "lean_path"}
    for side in cores.values():
        assert side["machine"] > 0
        procs = {k: v for k, v in side.items() if k != "machine"}
        assert set(procs) == {"client", "controller", "host"}
        assert all(x >= 0 for v in procs.values() for x in v.values())
    # The pathways host's XLA threads run niced (PATHWAYS_CPU_DEVICE_NICE): split apart.
    assert cores["pathways"]["host"]["run_niced"] > 0
    legs = chained["cycle_ms"]
    assert set(legs) == {
        "submitted",
        "controller_has_first",
        "host_starts_first",
        "host_ends_last",
        "client_has_result",
        "plain_jax",
    }
    # One clock: the host cannot start a launch before the controller has it, nor finish
    # the last before it starts the first, and the client has the result after both.
    assert 0 < legs["controller_has_first"] <= legs["host_starts_first"]
    assert legs["host_starts_first"] <= legs["host_ends_last"] <= legs["client_has_result"]
    training = json.loads((tmp_path / "training.json").read_text())
    first = training["first_step_loss"]
    assert abs(first["pathways_nb"] - first["plain_jax"]) < 1e-4  # the same program
    scale = json.loads((tmp_path / "scale.json").read_text())
    assert [p["devices"] for p in scale["points"]] == [8, 64, 256, 1024]
    biggest = scale["points"][-1]
    assert biggest["hosts"] == 128 and biggest["controller_live_handles"] >= 10_000
    assert set(biggest["us_per_program"]) == {"median", "min", "max", "n"}
    assert scale["ratio_1024_vs_8"] > 0 and "flat_cost_le_2x" in scale["targets_met"]
    moved = json.loads((tmp_path / "fetch.json").read_text())
    for k in ("fetch_pytree", "wait_pytree", "put_big", "fetch_big"):
        assert moved[k]["ratio"] > 0 and moved[k]["pathways_s"]["n"] == 3
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| measurement |") and "transfer" in table and "dispatch" in table
    assert "controller cost per program" in table
    assert "lean reference path" in table and "standard 1F1B" in table
    assert "a cycle of 16" in table
    assert "fetch a pytree of 100 small arrays" in table
    secured = json.loads((tmp_path / "tls.json").read_text())
    for k in ("round_trip", "put_big", "fetch_big", "transfer_big"):
        assert secured[k]["ratio"] > 0 and secured[k]["tls_s"]["n"] == 3
    assert "round trip of a tiny program on a cluster with TLS" in table
    profiled = json.loads((tmp_path / "profile.json").read_text())
    assert profiled["ratio"] > 0 and profiled["calls_per_s"]["profiled"]["n"] == 2
    assert profiled["xla_events_per_call"] > 0 and profiled["stop_s"]["min"] > 0
    assert "chained calls with XLA's profiler on the host" in table


def test_the_ab_benchmark_compares_a_checkout_with_itself(tmp_path: Path) -> None:
    """``python -m benchmarks.ab``: two clusters at once, alternating cycles; against its
    own checkout it measures the method's bias (no timing is asserted here)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "ab.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.ab", str(root), "--pairs", "4", "--json", str(out)],
        check=True,
        capture_output=True,
        cwd=root,
    )
    result = json.loads(out.read_text())
    assert result["benchmark"] == "ab" and result["params"]["pairs"] == 4
    assert set(result["cycle_ms"]) == {"A", "B"} and min(result["cycle_ms"].values()) > 0
    ratio = result["b_over_a"]
    assert ratio["n"] == 4 and ratio["q1"] <= ratio["median"] <= ratio["q3"]
    for bad, message in (
        (["/nonexistent"], "is not a checkout of pathways_nb"),
        ([str(root), "--env", "NOEQUALS"], "--env takes KEY=VALUE; got 'NOEQUALS'"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.ab", *bad], capture_output=True, text=True, cwd=root
        )
        assert proc.returncode != 0 and message in proc.stderr


def test_pathways_start_twice_reuses_the_cluster_and_stop_closes_it() -> None:
    from IPython.terminal.interactiveshell import TerminalInteractiveShell
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.io import capture_output

    from pathways_nb._magics import PathwaysMagics

    start_ipython()  # once per process; later calls return None
    magics = PathwaysMagics(TerminalInteractiveShell.instance())
    try:
        first = magics.pathways("start --islands 1 --devices 2")
        assert isinstance(first, pw.LocalCluster) and first.islands == 1
        assert "Dask dashboard" in first._repr_html_() and "1 island x" in repr(first)
        assert pw.Client.current() is magics.session.client
        with capture_output() as out:
            again = magics.pathways("start --islands 2 --devices 2")
        assert again is first and "reusing it" in out.stdout
        pids = [first.scheduler_pid, *first.worker_pids()]
    finally:
        magics.pathways("stop")
    assert magics.session.client is None and gone(pids, 30)


def test_the_cluster_command_serves_several_kernels_and_stops_on_ctrl_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathways_nb.deploy._cli import main

    info_file = tmp_path / "cluster.json"
    cmd = [sys.executable, "-m", "pathways_nb.deploy._cli", "cluster", "--islands", "2"]
    cmd += ["--devices", "2", "--no-dashboard", "--scheduler-file", str(info_file)]
    # Quotas per client, read where the controller runs and passed on to the hosts.
    env = {**os.environ, "PATHWAYS_TENANT_MAX_DEVICES": "2", "PATHWAYS_TENANT_STORE_BYTES": "65536"}
    served = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        info = wait_for_file(info_file, served, 120)
        assert info["pid"] == served.pid and info["islands"] == 2
        pids = _cluster_pids(served.pid)
        assert len(pids) >= 5  # scheduler, and a nanny and a worker per island
        # Two kernels' clients are two tenants of the one cluster.
        a = pw.Client(info["address"], name="kernel-a")
        b = pw.Client(scheduler_file=info_file, name="kernel-b")  # as dask.distributed's
        # %pathways connect takes the file as well as the address.
        from pathways_nb._magics import Session

        notebook = Session()
        assert (
            notebook.connect(str(info_file))
            .status()
            .summary.startswith("pathways_nb cluster: 2 islands, 4 devices")
        )
        notebook.stop()
        # --observe: a notebook that watches the shared cluster is no tenant of it.
        watcher = notebook.connect(info["address"], observer=True)
        assert watcher.observer and "2 tenants" in watcher.status().summary
        notebook.stop()
        va, vb = a.allocate({"x": 2}), b.allocate({"x": 2})
        assert va.island != vb.island
        x = np.arange(8, dtype=np.float32)
        assert np.asarray(pw.jit(jnp.cumsum)(va.put(x, P("x")))).tolist() == np.cumsum(x).tolist()
        with pytest.raises(pw.ResourceExhaustedError, match="of the 2 devices one client may"):
            a.allocate({"x": 1})
        with pytest.raises(pw.ResourceExhaustedError, match="over the 65536 bytes one client"):
            va.put(np.zeros(32 * 1024, np.float32), P("x")).fetch()
        b.close()
        assert main(["status", "--scheduler-file", str(info_file), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        # The status command looks as an observer: no tenant of its own.
        assert [t["name"] for t in report["tenants"]] == ["kernel-a"]
        assert report["quotas"] == {"max_devices": 2, "store_bytes": 65536}
        assert [t["devices"] for t in report["tenants"]] == [2]
        assert [s["mesh"] for s in report["slices"] if s["state"] == "active"] == [{"x": 2}]
        assert main(["status", info["address"]]) == 0
        text = capsys.readouterr().out
        assert "2 islands, 4 devices (2 in slices), 1 slices, 1 tenants" in text
        assert "kernel-a" in text and "pathways-nb status" not in text
        served.send_signal(signal.SIGINT)
        assert served.wait(60) == 0
        assert gone(pids, 30), f"still running: {pids}"
        assert not info_file.exists()
        with pytest.raises(pw.BrokenError, match="went away"):
            va.put(x).fetch()
        a.close()
    finally:
        if served.poll() is None:
            served.kill()
            served.wait()
    out = served.stdout.read().decode() if served.stdout else ""
    assert f"connect    pw.Client('{info['address']}')" in out, out


def test_a_dask_scheduler_without_the_preload_is_named_as_such(tmp_path: Path) -> None:
    sched_file = tmp_path / "scheduler.json"
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    cmd += ["--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)]
    log = tmp_path / "scheduler.log"
    with open(log, "wb") as err:
        plain = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        address = wait_for_file(sched_file, plain, 60)["address"]
        # It was a TypeError from inside the client ("'NoneType' object is not iterable").
        with pytest.raises(pw.BrokenError, match=r"runs no pathways controller.*--preload"):
            pw.Client(address, timeout=10)
        with pytest.raises(pw.BrokenError, match=r"runs no pathways controller"):
            pw.Client(scheduler_file=sched_file, timeout=10)  # Dask's own scheduler file
    finally:
        plain.terminate()
        plain.wait(30)
    # A scheduler that answers is not probed first: each probe is a line in its log.
    assert "closed before handshake" not in log.read_text(), log.read_text()
    with pytest.raises(ValueError, match=r"cannot read a scheduler address from .*nowhere.json"):
        pw.Client(scheduler_file=tmp_path / "nowhere.json")
    with pytest.raises(ValueError, match="an address or a scheduler_file, not both"):
        pw.Client("tcp://127.0.0.1:1", scheduler_file=sched_file)


def _lan_address() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def test_a_bad_setting_for_a_cluster_is_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match=r"got -1 \(PATHWAYS_TENANT_MAX_DEVICES\)"):
        pw.LocalCluster(1, 1, dashboard=False, env={"PATHWAYS_TENANT_MAX_DEVICES": "-1"})
    # An address of another machine (TEST-NET-1, never assigned) and a name that does
    # not resolve: the scheduler would exit with the cause deep in its traceback.
    for host in ("192.0.2.1", "no-such-host.invalid"):
        with pytest.raises(ValueError, match=rf"host='{host}' cannot be listened on here"):
            pw.LocalCluster(1, 1, dashboard=False, host=host)
    with pytest.raises(ValueError, match=r"such as 8786; got -1"):
        pw.LocalCluster(1, 1, dashboard=False, port=-1)
    # Sizes this machine cannot start: said at once, before a process or a list of
    # their settings is made.
    with pytest.raises(ValueError, match=r"up to 64; got islands=99999999999999999999"):
        pw.LocalCluster(99999999999999999999, 1, dashboard=False)
    with pytest.raises(ValueError, match=r"at most 1024 simulated CPU devices per host; got 4096"):
        pw.LocalCluster(1, 4096, dashboard=False)
    with (
        mock.patch("psutil.virtual_memory", return_value=mock.Mock(available=1 << 30)),
        pytest.raises(pw.ResourceExhaustedError, match=r"islands=8 starts 8 host processes"),
    ):
        pw.LocalCluster(8, 1, dashboard=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port {port} on 127.0.0.1 is in use"):
            pw.LocalCluster(1, 1, dashboard=False, port=port)
        with pytest.raises(SystemExit) as info:  # the command says so as a usage error
            cli(["cluster", "--islands", "1", "--devices", "1", "--port", str(port)])
        assert info.value.code == 2


def test_a_missing_checkpoint_root_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"does not exist on this machine.*PATHWAYS_CHECKPOINT_ROOT"
    ):
        pw.LocalCluster(
            1, 1, dashboard=False, env={"PATHWAYS_CHECKPOINT_ROOT": str(tmp_path / "nope")}
        )


def test_a_scheduler_that_removes_its_file_as_it_dies_is_reported_with_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scheduler whose preload fails writes its scheduler file and removes it as it
    exits: when the file vanished between being seen and being read, the exit and its log
    are what the cluster reports, not a FileNotFoundError."""
    from pathways_nb.deploy import _local

    real_spawn = _local.LocalCluster._spawn

    def spawn(self: Any, args: list[str], env: dict[str, str], log_name: str) -> None:
        if log_name == "scheduler.log":
            path = args[args.index("--scheduler-file") + 1]
            dies = (
                f"open({path!r}, 'w').write('{{}}'); "
                "print('ValueError: the in-flight window must be at least 1'); "
                "raise SystemExit(1)"
            )
            args = ["-c", dies]
        real_spawn(self, args, env, log_name)

    real_open = open

    def racing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("scheduler.json"):  # removed just after it was seen
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(_local.LocalCluster, "_spawn", spawn)
    monkeypatch.setattr(_local, "open", racing_open, raising=False)
    with pytest.raises(pw.BrokenError) as info:
        pw.LocalCluster(1, 1, dashboard=False, timeout=30)
    message = str(info.value)
    assert message.startswith("the Dask scheduler exited with code 1"), message
    assert "ValueError: the in-flight window must be at least 1" in message


def test_a_cluster_listens_on_the_address_it_is_given() -> None:
    with pytest.raises(ValueError, match=r"host is the address .* got '0.0.0.0'"):
        pw.LocalCluster(1, 1, host="0.0.0.0")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pw.LocalCluster(1, 1, dashboard=False, port=port) as cluster:
        assert cluster.scheduler_address == f"tcp://127.0.0.1:{port}"
        with pw.Client(f"tcp://127.0.0.1:{port}") as client:
            assert len(client.status().islands) == 1
    ip = _lan_address()
    if ip is None:
        pytest.skip("this machine has no address besides loopback")
    with pw.LocalCluster(1, 1, dashboard=False, host=ip) as cluster:
        assert cluster.scheduler_address.startswith(f"tcp://{ip}:")
        with pw.Client(cluster.scheduler_address) as client:
            assert all(h.startswith(f"tcp://{ip}:") for h in client.status().islands.host)
            vs = client.allocate({"x": 1})
            v = np.arange(4, dtype=np.float32)
            np.testing.assert_array_equal(np.asarray(vs.put(v) * 2), v * 2)
