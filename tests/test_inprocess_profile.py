"""client.profile: XLA's profiler on the hosts, its files, and its trace beside the schedule.

The in-process cluster's hosts share this process, so they share its one XLA profiler
session (``worker._profiles.PROCESS``); ``tests/test_cluster.py`` profiles hosts of
processes of their own.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config
from pathways_nb.worker._profiles import PROCESS


def _wait_until(done: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def two(client: pw.Client) -> Iterator[tuple[pw.VirtualSlice, pw.VirtualSlice]]:
    a = client.allocate({"x": 2}, name="enc")
    b = client.allocate({"x": 2}, name="dec")
    yield a, b
    assert PROCESS.holder() == 0, "a test left the process's profiler running"


def test_profile_writes_each_hosts_trace_and_joins_the_schedule(
    client: pw.Client, two: tuple[pw.VirtualSlice, pw.VirtualSlice], tmp_path: Path
) -> None:
    a, b = two
    x = a.put(np.ones((128, 128), np.float32), P("x"))
    enc = pw.jit(lambda v: jnp.tanh(v @ v.T), slice=a, name="encode")
    dec = pw.jit(lambda v: v.sum(), slice=b, name="decode")
    float(dec(enc(x)))  # compiled before the profile
    with client.profile(tmp_path / "prof") as prof:
        outs = [dec(enc(x)) for _ in range(4)]
        assert prof.started is not None and prof.started <= time.time()
    # Leaving the block waited for the launches: they are in the trace, whole.
    assert all(o.is_ready() for o in outs)
    want = float(np.tanh(np.ones((128, 128)) @ np.ones((128, 128))).sum())
    assert float(outs[-1]) == pytest.approx(want)
    # One session for the process: one host's folder holds it.
    assert len(prof.hosts) == 1
    trace = prof.hosts[0]
    assert trace.host in {a.host, b.host}
    assert trace.folder == str(tmp_path / "prof" / trace.host)
    assert trace.why == "stopped"
    names = {Path(p).name for p in trace.files}
    assert "perfetto_trace.json.gz" in names
    assert any(n.endswith(".xplane.pb") for n in names)  # what TensorBoard and XProf read
    for p in trace.files:
        assert Path(p).is_file() and Path(p).stat().st_size > 0
    assert trace.events, "the host sent its Perfetto trace"

    events = client.events(since=prof.started)
    doc = pw.viz.trace_events(events, profile=prof)
    xla = [e for e in doc["traceEvents"] if e["pid"] >= 1000 and e.get("ph") == "X"]
    ours = [e for e in doc["traceEvents"] if e["pid"] < 1000 and e.get("ph") == "X"]
    assert len(ours) >= 8 and xla
    # On one time axis: XLA's device work of the programs lies within the profile, and
    # XLA was busy while the runtime's programs ran.
    t0, t1 = trace.started * 1e6, trace.ended * 1e6
    assert all(t0 - 1e3 <= e["ts"] <= t1 + 1e3 for e in xla)
    # XLA's executables carry the programs' names.
    assert any("(jit_encode)" in e["name"] for e in xla)
    assert any("(jit_decode)" in e["name"] for e in xla)
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in ours if e["name"] == "encode"]
    inside = [e for e in xla if any(s - 500 <= e["ts"] <= f + 500 for s, f in runs)]
    assert len(inside) >= len(runs)
    labels = {
        e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"] >= 1000
    }
    assert labels and all(s.startswith(f"host {trace.host} XLA") for s in labels)

    path = pw.viz.write_trace(events, tmp_path / "merged.json.gz", profile=prof)
    with gzip.open(path) as f:
        assert json.load(f)["traceEvents"] == json.loads(json.dumps(doc["traceEvents"]))


def test_one_client_at_a_time_profiles_a_host(
    cluster: pw.InProcessCluster,
    client: pw.Client,
    two: tuple[pw.VirtualSlice, pw.VirtualSlice],
    tmp_path: Path,
) -> None:
    a, _ = two
    other = cluster.client()
    try:
        theirs = other.allocate({"x": 2})
        prof = client.profile(tmp_path / "mine", slices=a).start()
        with pytest.raises(pw.RemoteError, match="profiled for another client") as info:
            other.profile(tmp_path / "theirs").start()
        assert info.value.kind == "busy"
        # The refused client's work and the running profile go on.
        y = pw.jit(lambda v: v * 2, slice=theirs)(theirs.put(np.arange(4.0, dtype=np.float32)))
        np.testing.assert_array_equal(np.asarray(y), np.arange(4.0) * 2)
        prof.stop()
        assert [t.why for t in prof.hosts] == ["stopped"]
        with other.profile(tmp_path / "theirs"):
            pass  # its turn now
        assert not (tmp_path / "mine" / theirs.host).exists() or theirs.host == a.host
    finally:
        other.close()


def test_profiles_one_after_another_keep_their_own_files(
    client: pw.Client, two: tuple[pw.VirtualSlice, pw.VirtualSlice], tmp_path: Path
) -> None:
    runs = []
    for _ in range(3):  # within the same second, into the same folder
        with client.profile(tmp_path) as prof:
            pass
        runs.append(set(prof.files))
        assert any(p.endswith(".xplane.pb") for p in prof.files)
    assert not (runs[0] & runs[1]) and not (runs[1] & runs[2])


def test_python_true_traces_the_hosts_python_too(
    client: pw.Client, two: tuple[pw.VirtualSlice, pw.VirtualSlice], tmp_path: Path
) -> None:
    x = two[0].put(np.ones(4, np.float32))
    names = {}
    for python in (False, True):
        with client.profile(tmp_path / str(python), python=python) as prof:
            (x * 2).block_until_ready()
        # XLA's Python tracer names each call "$file:line function" or "$module name".
        names[python] = {e["name"] for t in prof.hosts for e in t.events if e.get("ph") == "X"}
    assert not any(n.startswith("$") for n in names[False])
    assert any(n.startswith("$") for n in names[True])


def test_a_host_ends_a_profile_at_its_time_limit(
    client: pw.Client, two: tuple[pw.VirtualSlice, pw.VirtualSlice], tmp_path: Path
) -> None:
    prof = client.profile(tmp_path / "p", limit=0.3).start()
    _wait_until(lambda: PROCESS.holder() == 0)
    prof.stop()
    assert [t.why for t in prof.hosts] == ["time limit"]
    assert any(p.endswith(".xplane.pb") for p in prof.files)


def test_a_profile_ends_when_its_client_goes(
    cluster: pw.InProcessCluster, two: tuple[pw.VirtualSlice, pw.VirtualSlice], tmp_path: Path
) -> None:
    other = cluster.client()
    other.allocate({"x": 2})
    other.profile(tmp_path / "gone").start()
    assert PROCESS.holder() != 0
    other.close()
    _wait_until(lambda: PROCESS.holder() == 0)


def test_bad_profiles_are_refused_clearly(
    cluster: pw.InProcessCluster,
    client: pw.Client,
    two: tuple[pw.VirtualSlice, pw.VirtualSlice],
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match=r"absolute folder.*os\.path\.abspath"):
        client.profile("relative/folder")
    with pytest.raises(ValueError, match="limit is the most seconds"):
        client.profile(tmp_path, limit=0)
    with pytest.raises(ValueError, match="limit is the most seconds"):
        client.profile(tmp_path, limit=float("nan"))
    with pytest.raises(TypeError, match="python is True or False"):
        client.profile(tmp_path, python="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="VirtualSlices"):
        client.profile(tmp_path, slices=["enc"]).start()
    other = cluster.client()
    try:
        with pytest.raises(ValueError, match="this client's slices, and it has none"):
            other.profile(tmp_path).start()
        with pytest.raises(ValueError, match="belongs to another client"):
            other.profile(tmp_path, slices=two[0]).start()
    finally:
        other.close()
    # A folder the host cannot make: the host says why, and keeps serving.
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(pw.RemoteError, match=r"FileExistsError|NotADirectoryError"):
        client.profile(tmp_path / "file" / "sub").start()
    prof = client.profile(tmp_path / "ok")
    with pytest.raises(RuntimeError, match="only a running one stops"):
        prof.stop()
    with prof:
        pass
    with pytest.raises(RuntimeError, match="make a new one"):
        prof.start()
    # A request of the wrong shape gets an error reply, as every bad message does.
    ask = client._io.host_request(two[0].data_address, {"t": "profile", "op": "pause"})
    with pytest.raises(pw.RemoteError, match="op is 'start' or 'stop'"):
        ask.result(30)
    ask = client._io.host_request(two[0].data_address, {"t": "profile", "op": "stop"})
    with pytest.raises(pw.RemoteError, match="not profiling for this client"):
        ask.result(30)
    y = pw.jit(lambda v: v + 1, slice=two[0])(two[0].put(np.zeros(2, np.float32)))
    np.testing.assert_array_equal(np.asarray(y), [1.0, 1.0])


def test_a_checkpoint_root_confines_profiles_too(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with (
        pw.InProcessCluster(1, 2, config=Config(checkpoint_root=str(root))) as c,
        c.client() as client,
    ):
        client.allocate({"x": 2})
        with pytest.raises(pw.RemoteError, match="outside this cluster's checkpoint folder"):
            client.profile(tmp_path / "elsewhere").start()
        with client.profile(root / "inside") as prof:
            pass
        assert prof.hosts[0].folder.startswith(str(root))
