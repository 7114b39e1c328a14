"""``%pathways`` in a real IPython shell."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from IPython.terminal.interactiveshell import TerminalInteractiveShell
from IPython.testing.globalipapp import start_ipython
from IPython.utils.io import capture_output

import pathways_nb as pw
from pathways_nb._magics import PathwaysMagics, Session
from pathways_nb._magics import UsageError as MagicsUsageError
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


def test_help_and_usage_errors(ip: Any) -> None:
    with capture_output() as out:
        ip.run_line_magic("pathways", "")
    assert "%pathways start" in out.stdout and "%%pathways --slice" in out.stdout
    with capture_output() as out:
        ip.run_line_magic("pathways", "frobnicate")
    assert "UsageError: unknown command 'frobnicate'" in out.stdout
    with capture_output() as out:
        ip.run_line_magic("pathways", "timeline --last soon")
    assert "UsageError: a duration is a number" in out.stdout
    with capture_output() as out:
        ip.run_line_magic("pathways", "graph 1 +")
    assert "UsageError: graph takes a Python call" in out.stdout
    # A scheduler file that is not there is said as such, and a connect that fails
    # keeps the session's client.
    before = pw.Client.current()
    with capture_output() as out:
        ip.run_line_magic("pathways", "connect missing/cluster.json")
    assert "UsageError: no scheduler file at 'missing/cluster.json'" in out.stdout
    with pytest.raises(pw.BrokenError, match=r"nothing listens at tcp://127\.0\.0\.1:1"):
        ip.run_line_magic("pathways", "connect tcp://127.0.0.1:1")
    assert not before.closed and pw.Client.current() is before


def test_a_start_no_cluster_can_take_is_a_usage_error() -> None:
    with pytest.raises(MagicsUsageError, match="devices_per_island must be a positive integer"):
        Session().start(islands=1, devices=0)
    with pytest.raises(MagicsUsageError, match=r"platform is 'cpu' .* got ''"):
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
        assert "1 islands x 2 auto devices with TLS is running; reusing it" in out.stdout
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
    with capture_output() as out:
        ip.run_cell_magic("pathways", "--slice nowhere", "1")
    assert "no slice named 'nowhere'" in out.stdout and "name=" in out.stdout


def test_trace_writes_perfetto_json(ip: Any, tmp_path: Path) -> None:
    path = tmp_path / "step.json"
    with capture_output() as out:
        ip.run_line_magic("pathways", f"trace {path}")
    assert "perfetto" in out.stdout
    doc = json.loads(path.read_text())
    assert any(e.get("name") == "f" and e["ph"] == "X" for e in doc["traceEvents"])
    with capture_output() as out:
        ip.run_line_magic("pathways", f"trace {tmp_path / 'missing' / 'step.json'}")
    assert "cannot write the trace to" in out.stdout and "No such file" in out.stdout


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
        with capture_output() as out:
            ip.run_cell_magic("pathways", line, "1")
        assert said in out.stdout, (line, out.stdout)
    ip.run_cell("pw.Client.current().release(prof_slice)")


def test_commands_before_a_cluster_say_how_to_start_one() -> None:
    m = PathwaysMagics(_shell())
    with capture_output() as out:
        m.pathways("status")
    assert "%pathways start" in out.stdout and "%pathways connect" in out.stdout
