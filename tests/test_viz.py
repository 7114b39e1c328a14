"""Timelines, traces and widgets, drawn from a real event log (in-process cluster)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.viz import (
    DevicesWidget,
    GraphWidget,
    StatusWidget,
    TimelineWidget,
    intervals,
    parse_duration,
    trace_events,
)


def test_intervals_pair_launch_start_and_end_of_programs_and_transfers(ran: pw.Client) -> None:
    rows = intervals(ran.events())
    progs = rows[rows.kind == "program"]
    moves = rows[rows.kind == "transfer"]
    assert sorted(set(progs.name)) == ["decode", "encode"] and len(progs) == 6
    assert len(moves) == 3  # each call's encoded array moves to the decoder's slice
    assert (rows.launch <= rows.start + 1e-3).all() and (rows.start <= rows.end).all()
    m = moves.iloc[0]
    assert m.source != m.host and m.bytes == 4 * 4 * 4


def test_parse_duration() -> None:
    assert parse_duration("5s") == 5.0 and parse_duration("250ms") == 0.25
    assert parse_duration("2m") == 120.0 and parse_duration("1.5") == 1.5
    with pytest.raises(ValueError, match=r"e\.g\. 5s or 250ms"):
        parse_duration("five seconds")


def test_a_timeline_window_must_be_positive(ran: pw.Client) -> None:
    for last in (-5, 0, "5s"):
        with pytest.raises(ValueError, match=r"last is a window in seconds, > 0"):
            TimelineWidget(ran, last=last, live=False)  # type: ignore[arg-type]


def test_a_timeline_draws_at_least_one_row(ran: pw.Client) -> None:
    for rows in (0, -5):
        with pytest.raises(ValueError, match=rf"max_rows .* 1 or more .*; got {rows}$"):
            TimelineWidget(ran, live=False, max_rows=rows)
    for rows in ("x", 2.5, True):
        with pytest.raises(TypeError, match=rf"max_rows .* whole number .*; got \w+ {rows!r}$"):
            TimelineWidget(ran, live=False, max_rows=rows)  # type: ignore[arg-type]


@pytest.mark.parametrize("widget", [TimelineWidget, StatusWidget, DevicesWidget])
def test_a_widget_given_an_address_instead_of_a_client_says_what_it_takes(
    ran: pw.Client, widget: Any
) -> None:
    with pytest.raises(
        TypeError,
        match=r"shows a pw.Client's cluster; got str 'tcp://x:1'\. "
        r"Pass pw.Client\('tcp://x:1'\)",
    ):
        widget("tcp://x:1", live=False)
    with pytest.raises(TypeError, match=r"got int 42\. Pass a pw.Client, or nothing"):
        widget(42, live=False)


def test_the_trace_is_valid_trace_event_json(ran: pw.Client, tmp_path: Path) -> None:
    doc = trace_events(ran.events())
    events = doc["traceEvents"]
    json.dumps(doc)  # serializable
    complete = [e for e in events if e["ph"] == "X"]
    for e in events:
        assert {"ph", "pid"} <= set(e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and {"name", "tid"} <= set(e)
    assert all(e["dur"] >= 0 for e in complete)
    names = {e["name"] for e in complete}
    assert {"encode", "decode", "transfer"} <= names
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert len(flows) == 6
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    for e in flows:
        if e["ph"] == "f":  # from the source host to the destination
            assert starts[e["id"]]["pid"] != e["pid"] and starts[e["id"]]["ts"] <= e["ts"]
    assert any(e["ph"] == "b" and e["cat"] == "queued" for e in events)
    names_meta = [e["args"]["name"] for e in events if e["ph"] == "M"]
    assert any(n.startswith("slice") for n in names_meta)
    path = pw.viz.write_trace(ran.events(), tmp_path / "step.json")
    assert json.loads(Path(path).read_text()) == json.loads(json.dumps(doc))


def test_timeline_widget_state_and_fallback(ran: pw.Client) -> None:
    w = TimelineWidget(ran, live=False)
    state = w.get_state()
    assert len(state["rows"]) == 9 and state["lanes"] == sorted(state["lanes"])
    # Lanes are labelled by the slices' names, as the placement map is.
    slices = {s.name: s for s in ran.slices}
    assert state["lanes"] == sorted(f"{slices[n].island}/{n}" for n in ("enc", "dec"))
    assert {r["lane"] for r in state["rows"]} == set(state["lanes"])
    assert {r["kind"] for r in state["rows"]} == {"program", "transfer"}
    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/html"].count("<rect") == 9
    js = (Path(pw.viz.__file__).parent / "static" / "timeline.js").read_text()
    assert "queued" in js and "http" not in js.replace("http://www.w3.org", "")


def test_a_live_timeline_moves_while_a_loop_runs(client: pw.Client) -> None:
    vs = client.allocate({"x": 2})
    f = pw.jit(lambda v: v + 1.0, slice=vs, name="tick")
    x = vs.put(np.zeros(2, np.float32), P("x"))
    w = TimelineWidget(client, last=30.0, interval=0.05)
    try:
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 3:
            x = f(x)
            x.block_until_ready()
            n = len(w.rows)
            if not seen or n > seen[-1]:
                seen.append(n)
        # It refreshed on its own thread, several times, while this loop kept running.
        assert len(seen) >= 3 and seen == sorted(seen)
    finally:
        w.close()
    assert w._refresher._thread is None


def test_status_and_devices_widgets(ran: pw.Client) -> None:
    s = StatusWidget(ran, live=False)
    assert "<table" in s.html and "enc" in s.html and s.summary.startswith("pathways_nb cluster")
    for title in ("islands", "devices", "slices", "tenants", "latest events"):
        assert f"<h4>{title}</h4>" in s.html
    assert "quotas per client" not in s.html  # this cluster sets none
    d = DevicesWidget(ran, live=False)
    held = [x for x in d.devices if x["slice"]]
    assert {x["slice"] for x in held} == {"enc", "dec"}
    assert {x["program"] for x in held} == {"encode", "decode"}
    assert "<table" in d._fallback_html()


def test_an_observers_widgets_show_every_tenants_work(
    ran: pw.Client, cluster: pw.InProcessCluster
) -> None:
    watcher = cluster.client(observer=True)
    try:
        d = DevicesWidget(watcher, live=False)
        assert {x["program"] for x in d.devices if x["slice"]} == {"encode", "decode"}
        t = TimelineWidget(watcher, live=False)
        mine = [r for r in t.rows if r["tenant"] == ran.tenant]
        assert sorted({r["name"] for r in mine if r["kind"] == "program"}) == ["decode", "encode"]
        # Another tenant's slices are named by their allocations in the log (with their
        # ids where earlier tests' tenants had slices of the same names).
        names = {r["lane"].split("/")[1].split(" (s")[0] for r in mine if r["kind"] == "program"}
        assert names == {"dec", "enc"}
    finally:
        watcher.close()


def test_graph_widget(ran: pw.Client) -> None:
    a = ran.allocate({"x": 2})
    b = ran.allocate({"x": 2})
    enc = pw.jit(lambda v: v * 2, slice=a, name="encode")
    dec = pw.jit(lambda v: v + 1, slice=b, name="decode")
    x = a.put(np.ones(4, np.float32), P("x"))
    w = GraphWidget(ran.graph(lambda v: dec(enc(v)), x))
    assert w.nodes == 3 and w.dot.startswith("digraph")
    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "digraph" in data["text/html"] or "<svg" in data["text/html"]
    with pytest.raises(TypeError, match="DataflowGraph or DOT"):
        GraphWidget(42)  # type: ignore[arg-type]


class _RecordingComm:
    """Stands in for the kernel's comm: keeps what a widget sends to the frontend."""

    def __init__(self, **kwargs: Any) -> None:
        self.opened = kwargs
        self.sent: list[dict[str, Any]] = []
        self.comm_id = "recording"
        self.kernel = object()

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.sent.append(data)

    def on_msg(self, callback: Any) -> None:
        pass

    def on_close(self, callback: Any) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_widgets_send_their_state_to_the_frontend(
    client: pw.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import comm

    comms: list[_RecordingComm] = []
    monkeypatch.setattr(
        comm, "create_comm", lambda **kw: comms.append(_RecordingComm(**kw)) or comms[-1]
    )
    vs = client.allocate({"x": 2})
    f = pw.jit(lambda v: v * 3.0, slice=vs, name="triple")
    x = vs.put(np.ones(2, np.float32), P("x"))
    w = TimelineWidget(client, live=False)
    # The timeline's own comm (anywidget may open others alongside).
    c = next(c for c in comms if "rows" in c.opened["data"]["state"])
    assert c.opened["target_name"] == "jupyter.widget"
    first = c.opened["data"]["state"]
    assert "_esm" in first and isinstance(first["rows"], list)
    f(x).block_until_ready()
    client.wait_all()
    w.refresh()
    updates = [m for m in c.sent if m.get("method") == "update"]
    rows = [r for m in updates for r in m["state"].get("rows", [])]
    assert any(r["name"] == "triple" and r["kind"] == "program" for r in rows)
    w.close()
