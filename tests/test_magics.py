"""``%pathways`` in a real IPython shell."""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from _interrupts import interrupted_when_blocked_in
from IPython.core.error import UsageError
from IPython.terminal.interactiveshell import TerminalInteractiveShell
from IPython.testing.globalipapp import start_ipython
from IPython.utils.io import capture_output
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._magics import PathwaysMagics, Session
from pathways_nb.viz import DevicesWidget, GraphWidget, StatusWidget, TimelineWidget


def _shell() -> Any:
    """The test IPython shell (one per process: start_ipython makes it once)."""
    start_ipython()
    return TerminalInteractiveShell.instance()


@pytest.fixture(scope="module")
def ip(cluster: pw.InProcessCluster) -> Iterator[Any]:
    shell = _shell()
    shell.run_line_magic("load_ext", "pathways_nb")
    magics = shell.magics_manager.registry["PathwaysMagics"]
    assert isinstance(magics, PathwaysMagics)
    # `%pathways connect` to the in-process controller, as it would to a scheduler address.
    magics.session.client = cluster.client()
    shell.user_ns["pw"] = pw
    yield shell
    magics.session.stop()


@contextlib.contextmanager
def _slice(ip: Any, name: str) -> Iterator[pw.VirtualSlice]:
    """A slice of the session's client named ``name``, released after (the cluster has
    eight devices for the whole module)."""
    client = ip.magics_manager.registry["PathwaysMagics"].session.client
    vs = client.allocate({"x": 2}, name=name)
    try:
        yield vs
    finally:
        client.release(vs)


def _cell(ip: Any, source: str) -> tuple[Any, Any]:
    """Run ``source`` as a notebook runs a cell: its result, and what it printed."""
    with capture_output() as out:
        result = ip.run_cell(source, store_history=True)
    return result, out


def test_help_and_usage_errors(ip: Any) -> None:
    with capture_output() as out:
        ip.run_line_magic("pathways", "")
    assert "%pathways start" in out.stdout and "%%pathways --slice" in out.stdout
    with pytest.raises(UsageError, match="unknown command 'frobnicate'"):
        ip.run_line_magic("pathways", "frobnicate")
    with pytest.raises(UsageError, match="a duration is a number"):
        ip.run_line_magic("pathways", "timeline --last soon")
    with pytest.raises(UsageError, match="graph takes a Python call"):
        ip.run_line_magic("pathways", "graph 1 +")
    # A usage error fails the cell as any error does, so that "Run All" stops there.
    result, out = _cell(ip, "%pathways frobnicate")
    assert not result.success and isinstance(result.error_in_exec, UsageError)
    assert "UsageError: unknown command 'frobnicate'" in out.stderr
    # A scheduler file that is not there is said as such, and a connect that fails
    # keeps the session's client.
    before = pw.Client.current()
    with pytest.raises(UsageError, match=r"no scheduler file at 'missing/cluster.json'"):
        ip.run_line_magic("pathways", "connect missing/cluster.json")
    with pytest.raises(pw.BrokenError, match=r"nothing listens at tcp://127\.0\.0\.1:1"):
        ip.run_line_magic("pathways", "connect tcp://127.0.0.1:1")
    assert not before.closed and pw.Client.current() is before


def test_help_lists_the_commands(ip: Any) -> None:
    _, out = _cell(ip, "%pathways?")
    for usage in ["%pathways start", "%pathways connect ADDRESS|FILE", "%pathways trace FILE"]:
        assert usage in out.stdout, out.stdout
    assert "%%pathways --profile DIR" in out.stdout
    with capture_output() as out:
        ip.run_line_magic("pathways", "status --help")
    assert "%pathways timeline" in out.stdout


def test_a_start_no_cluster_can_take_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="devices_per_island must be a positive integer"):
        Session().start(islands=1, devices=0)
    with pytest.raises(UsageError, match=r"platform is 'cpu' .* got ''"):
        Session().start(islands=1, devices=1, platform="")


def test_start_takes_the_platform_and_reuses_a_running_cluster(ip: Any) -> None:
    session = ip.magics_manager.registry["PathwaysMagics"].session
    client, session.client = session.client, None
    try:
        # auto: the accelerators JAX finds; here none, so each island's CPU devices.
        # --tls: every link encrypted, on certificates made for this cluster.
        cluster = ip.run_line_magic(
            "pathways", "start --islands 1 --devices 2 --platform auto --tls"
        )
        assert isinstance(cluster, pw.LocalCluster) and cluster.platform is None
        assert cluster.scheduler_address.startswith("tls://")
        assert session.client.controller_address.startswith("tls://")
        assert list(session.client.status().islands.devices) == [2]
        with capture_output() as out:
            again = ip.run_line_magic("pathways", "start --islands 1 --devices 2")
        assert again is cluster
        assert "1 island x 2 auto devices at tls://" in out.stdout
        assert "with TLS; reusing it" in out.stdout
    finally:
        ip.run_line_magic("pathways", "stop")
        session.client = client


def test_status_devices_timeline_and_graph(ip: Any) -> None:
    ip.run_cell(
        "vs = pw.Client.current().allocate({'x': 2}, name='train')\n"
        "import numpy as np, jax.numpy as jnp\n"
        "from jax.sharding import PartitionSpec as P\n"
        "f = pw.jit(lambda v: jnp.sin(v) + 1, slice=vs, name='f')\n"
        "x = vs.put(np.ones(4, np.float32), P('x'))\n"
        "y = f(x); y.block_until_ready()\n"
    )
    status = ip.run_line_magic("pathways", "status --static")
    assert isinstance(status, StatusWidget) and "train" in status.html
    devices = ip.run_line_magic("pathways", "devices --static")
    assert isinstance(devices, DevicesWidget)
    assert any(d["slice"] == "train" and d["program"] == "f" for d in devices.devices)
    tl = ip.run_line_magic("pathways", "timeline --last 60s --static")
    assert isinstance(tl, TimelineWidget) and any(r["name"] == "f" for r in tl.rows)
    g = ip.run_line_magic("pathways", "graph f(x)")
    assert isinstance(g, GraphWidget) and g.nodes == 2 and "f" in g.dot
    for w in (status, devices, tl):
        w.close()


def test_cell_magic_sets_the_default_slice(ip: Any) -> None:
    ip.run_cell("other = pw.Client.current().allocate({'x': 2}, name='other')")
    ip.run_cell_magic(
        "pathways", "--slice other", "z = pw.jit(lambda: jnp.arange(3.0))()\nzs = z.slice.name\n"
    )
    assert ip.user_ns["zs"] == "other"
    assert np.allclose(np.asarray(ip.user_ns["z"]), [0.0, 1.0, 2.0])
    with pytest.raises(UsageError, match=r"no slice named 'nowhere'.* name="):
        ip.run_cell_magic("pathways", "--slice nowhere", "1")


def test_trace_writes_perfetto_json(ip: Any, tmp_path: Path) -> None:
    path = tmp_path / "step.json"
    with capture_output() as out:
        ip.run_line_magic("pathways", f"trace {path}")
    assert "perfetto" in out.stdout
    doc = json.loads(path.read_text())
    assert any(e.get("name") == "f" and e["ph"] == "X" for e in doc["traceEvents"])
    with pytest.raises(UsageError, match=r"cannot write the trace to .*No such file"):
        ip.run_line_magic("pathways", f"trace {tmp_path / 'missing' / 'step.json'}")


def test_cell_magic_profiles_the_cell_on_the_hosts(ip: Any, tmp_path: Path) -> None:
    ip.run_cell("prof_slice = pw.Client.current().allocate({'x': 2}, name='prof')")
    trace = tmp_path / "step.json.gz"
    with capture_output() as out:
        prof = ip.run_cell_magic(
            "pathways",
            f"--slice prof --profile {tmp_path / 'p'} --trace {trace}",
            "pz = pw.jit(lambda: jnp.arange(4.0) * 2, name='doubled')()\n",
        )
    assert isinstance(prof, pw.Profile) and prof.hosts
    assert np.allclose(np.asarray(ip.user_ns["pz"]), [0.0, 2.0, 4.0, 6.0])
    assert ip.user_ns["pz"].slice.name == "prof"
    assert "profiled 1 host(s)" in out.stdout and str(tmp_path / "p") in out.stdout
    assert "wrote" in out.stdout
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "doubled" and e["ph"] == "X" for e in events)
    assert any(e["pid"] >= 1000 and e.get("ph") == "X" for e in events)  # XLA's own
    for line, said in [
        ("--profile relative", "absolute folder"),
        (f"--trace {trace}", "--trace FILE goes with --profile DIR"),
        ("", "--slice NAME and/or --profile DIR"),
    ]:
        with pytest.raises(UsageError, match=said):
            ip.run_cell_magic("pathways", line, "1")
    ip.run_cell("pw.Client.current().release(prof_slice)")


def test_commands_before_a_cluster_say_how_to_start_one() -> None:
    m = PathwaysMagics(_shell())
    with pytest.raises(UsageError, match=r"no cluster yet.*%pathways start.*%pathways connect"):
        m.pathways("status")


def test_a_cell_that_raises_fails_as_any_failing_cell(ip: Any) -> None:
    with _slice(ip, "fails"):
        for body, kind in [
            ("1/0", ZeroDivisionError),
            ("raise KeyboardInterrupt", KeyboardInterrupt),
        ]:
            result, out = _cell(ip, f"%%pathways --slice fails\nbefore = 1\n{body}")
            assert not result.success and isinstance(result.error_in_exec, kind), out.stdout
            assert ip.user_ns["before"] == 1 and out.stdout.count(f"{kind.__name__}:") == 1
    # The same for a plain cell, to compare with.
    plain, _ = _cell(ip, "1/0")
    assert not plain.success and isinstance(plain.error_in_exec, ZeroDivisionError)


def test_a_profiled_cell_that_raises_stops_the_profile_then_fails(ip: Any, tmp_path: Path) -> None:
    with _slice(ip, "failing"):
        result, out = _cell(
            ip,
            f"%%pathways --slice failing --profile {tmp_path / 'p'}\n"
            "import jax.numpy as jnp\n"
            "pw.jit(lambda: jnp.arange(2.0))().block_until_ready()\n"
            "raise ValueError('in the profile')",
        )
        assert not result.success and isinstance(result.error_in_exec, ValueError)
        assert "profiled 1 host(s)" in out.stdout and str(tmp_path / "p") in out.stdout
        # Stopped: the host's one profiler is free for the next profile.
        with capture_output():
            prof = ip.run_cell_magic("pathways", f"--slice failing --profile {tmp_path}/q", "1")
        assert isinstance(prof, pw.Profile) and prof.hosts


def test_the_cells_value_is_shown_once(ip: Any, tmp_path: Path) -> None:
    with _slice(ip, "once"):
        result, out = _cell(ip, "%%pathways --slice once\n'shown' * 3")
        assert result.success and result.result == "shownshownshown"
        assert out.stdout.count("shownshownshown") == 1, out.stdout
        # Under --profile the Out is the profile; the cell's own value is shown once too.
        result, out = _cell(ip, f"%%pathways --slice once --profile {tmp_path}\n'shown' * 3")
        assert isinstance(result.result, pw.Profile)
        shown = [o.data.get("text/plain") for o in out.outputs]
        assert shown == ["'shownshownshown'"] and "shownshown" not in out.stdout, out.stdout


def test_graph_takes_the_call_as_written(ip: Any) -> None:
    with _slice(ip, "gs") as gs:
        ip.user_ns["gs"] = gs
        ip.run_cell(
            "import numpy as np\n"
            "from jax.sharding import PartitionSpec as P\n"
            "scaled = pw.jit(lambda v, scale=1.0: v * scale, slice=gs, name='scaled')\n"
            "gx = gs.put(np.ones(4, np.float32), P('x'))\n"
            "gxs, gkw = [gx], {'scale': 2.0}\n"
        )
        plain = ip.run_line_magic("pathways", "graph scaled(gx)")
        written = ip.run_line_magic("pathways", "graph scaled(gx, scale=2.0)")
        spread = ip.run_line_magic("pathways", "graph scaled(*gxs, **gkw)")
        assert "1 edges" in plain.title and "2 edges" in written.title, (plain, written)
        assert spread.dot == written.dot
        # Python's own error for the call written, naming the function called.
        with pytest.raises(TypeError, match=r"^scaled\(\) got multiple values for keyword"):
            ip.run_line_magic("pathways", "graph scaled(gx, **gkw, scale=3.0)")
        with pytest.raises(TypeError, match=r"^scaled\(\) argument after \*\* must be a mapping"):
            ip.run_line_magic("pathways", "graph scaled(gx, **gxs)")


def test_arguments_are_split_as_a_shell_splits_them(ip: Any, tmp_path: Path) -> None:
    with _slice(ip, "my slice"):
        for quoted in ["'my slice'", '"my slice"']:
            ip.run_cell_magic(
                "pathways",
                f"--slice {quoted}",
                "import jax.numpy as jnp\non = pw.jit(lambda: jnp.zeros(2))().slice.name",
            )
            assert ip.user_ns["on"] == "my slice"
    path = tmp_path / "a b.json"
    with capture_output():
        ip.run_line_magic("pathways", f"trace '{path}'")
    assert "traceEvents" in json.loads(path.read_text())
    with pytest.raises(UsageError, match="no closing quotation"):
        ip.run_line_magic("pathways", "trace 'a b.json")
    with pytest.raises(UsageError, match=r"connect takes an address.*got ''"):
        ip.run_line_magic("pathways", "connect ''")


# State _held shares with the tests: this module's, so it goes to the hosts by
# reference, and the in-process hosts find this very module.
_RELEASE = threading.Event()


def _held(v: jax.Array) -> np.ndarray:
    if not _RELEASE.wait(30):
        raise TimeoutError("the test never let the function go")
    return np.asarray(v) + 1


def test_trace_says_what_it_waits_for_and_an_interrupt_stops_it(ip: Any, tmp_path: Path) -> None:
    with _slice(ip, "held") as vs:
        _trace_waits(ip, vs, tmp_path)


def _trace_waits(ip: Any, vs: pw.VirtualSlice, tmp_path: Path) -> None:
    x = vs.put(np.ones(4, np.float32), P("x")).block_until_ready()
    held = pw.colocated(_held, out=lambda v: v)
    _RELEASE.clear()
    try:
        y = held(x)
        path = tmp_path / "interrupted.json"
        with (
            capture_output(),
            pytest.raises(KeyboardInterrupt),
            interrupted_when_blocked_in("wait_all", "_session.py"),
        ):
            ip.run_line_magic("pathways", f"trace {path}")
        # Nothing written, and the launch it waited for goes on.
        assert not path.exists() and not y.is_ready()
        with capture_output() as out:

            def release_once_said() -> None:
                deadline = time.monotonic() + 30
                while "waiting for" not in out.stdout and time.monotonic() < deadline:
                    time.sleep(0.01)
                _RELEASE.set()

            releaser = threading.Thread(target=release_once_said)
            releaser.start()
            try:
                ip.run_line_magic("pathways", f"trace {tmp_path / 'waited.json'}")
            finally:
                releaser.join()
    finally:
        _RELEASE.set()
    said = "waiting for 1 launch of this client to finish before writing the trace"
    assert said in out.stdout and "wrote" in out.stdout, out.stdout
    np.testing.assert_array_equal(y.fetch(), np.full(4, 2.0))
    doc = json.loads((tmp_path / "waited.json").read_text())
    assert any(e.get("name") == "_held" and e["ph"] == "X" for e in doc["traceEvents"])


def test_last_is_a_window_above_zero(ip: Any) -> None:
    for given in ["0s", "-1s", "0"]:
        with pytest.raises(UsageError, match=f"--last is a window of time above 0.*got '{given}'"):
            ip.run_line_magic("pathways", f"timeline --last {given} --static")


def test_words_a_command_does_not_take_are_refused(ip: Any) -> None:
    for line, said in [
        ("status extra garbage --static", "status takes no arguments .*got 2: extra garbage"),
        ("devices --static nonsense", "devices takes no arguments .*got 1: nonsense"),
        ("status --last 5s", "--last is an option of timeline, not of status"),
        ("--profile /tmp/p", "--profile is an option of the cell magic: put %%pathways"),
        ("--static", "--static goes after a command, e.g. %pathways status --static"),
        ("trace a.json b.json", "trace takes one file name"),
        ("stop now", "stop takes no arguments"),
        ("start --islands", "--islands takes a value; got none"),
    ]:
        with pytest.raises(UsageError, match=said):
            ip.run_line_magic("pathways", line)
    ip.user_ns.pop("ran", None)
    for line, said in [
        ("status --islands 9 --slice x", "--islands is an option of %pathways start"),
        ("status", "only --slice NAME, --profile DIR and --trace FILE"),
        ("--slice a --slice b", "--slice is given twice"),
    ]:
        result, _ = _cell(ip, f"%%pathways {line}\nran = True")
        assert isinstance(result.error_in_exec, UsageError), line
        assert said in str(result.error_in_exec) and "ran" not in ip.user_ns


def test_start_does_not_take_over_a_connected_or_observing_client(
    ip: Any, cluster: pw.InProcessCluster
) -> None:
    session = ip.magics_manager.registry["PathwaysMagics"].session
    with pytest.raises(UsageError, match=r"connected to the cluster at inproc://.*%pathways stop"):
        ip.run_line_magic("pathways", "start --islands 1 --devices 1")
    client = session.client
    watcher = cluster.client(name="watcher", observer=True)
    session.client = watcher
    try:
        with pytest.raises(UsageError, match=r"only observes the cluster at .*cannot allocate"):
            ip.run_line_magic("pathways", "start --islands 1 --devices 1")
    finally:
        session.client = client
        watcher.close()
    assert session.cluster is None


def test_a_closed_client_is_said_closed(cluster: pw.InProcessCluster) -> None:
    m = PathwaysMagics(_shell())
    m.session.client = cluster.client()
    m.session.client.close()
    closed = r"client of the cluster at inproc://\S+ is closed .*%pathways start"
    for line in ["status --static", "trace x.json", "graph f(x)", "timeline"]:
        with pytest.raises(UsageError, match=closed):
            m.pathways(line)
    with pytest.raises(UsageError, match=closed):
        m.pathways("--slice train", "1")
