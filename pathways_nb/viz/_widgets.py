"""Live widgets: timeline, dataflow graph, cluster status, device placement.

Each is an anywidget whose JavaScript is bundled into the package (``static/``), so no
network is needed to draw it. Live ones refresh from ``client.status()`` and the event
log on a background thread at a bounded rate, so they keep moving while a cell trains,
and never block the kernel's event loop. Outside a live kernel (nbconvert, GitHub) each
shows an HTML fallback drawn in Python.
"""

from __future__ import annotations

import html
import pathlib
import shutil
import threading
import time
import weakref
from typing import Any

import anywidget
import pandas as pd
import traitlets

from pathways_nb.client import Client, DataflowGraph, Status
from pathways_nb.viz._svg import timeline_svg
from pathways_nb.viz._timeline import Tracker

_STATIC = pathlib.Path(__file__).parent / "static"


class _Refresher:
    """Calls ``widget.refresh()`` every ``interval`` seconds on a daemon thread until the
    widget is closed or garbage, or ``stop()``. Start and stop are safe to call twice."""

    def __init__(self, widget: Any, interval: float) -> None:
        self._ref = weakref.ref(widget)
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pw-viz-refresh", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            w = self._ref()
            if w is None or w._closed:
                return
            try:
                w.refresh()
            except Exception as exc:  # the client closed: stop quietly, say why once
                w.error = f"{type(exc).__name__}: {exc}"
                return
            del w


class _Live(anywidget.AnyWidget):
    """What the live widgets share: a client, a refresh thread, an error line."""

    error = traitlets.Unicode("").tag(sync=True)
    updated = traitlets.Float(0.0).tag(sync=True)

    def __init__(self, client: Client | None, live: bool, interval: float, **kw: Any) -> None:
        super().__init__(**kw)
        self._client = client or Client.current()
        self._closed = False
        if interval < 0.05:
            raise ValueError(f"refresh interval must be at least 0.05 s; got {interval}")
        self._refresher = _Refresher(self, interval)
        self.refresh()
        if live:
            self._refresher.start()

    def refresh(self) -> None:
        """Pull the client's latest state into the synced traits; each widget draws its own."""
        raise NotImplementedError(f"{type(self).__name__} must define refresh()")

    def stop(self) -> None:
        """Stop refreshing; the widget keeps its last picture."""
        self._refresher.stop()

    def close(self) -> None:
        self._closed = True
        refresher = getattr(self, "_refresher", None)  # absent if __init__ refused its input
        if refresher is not None:
            refresher.stop()
        super().close()

    def _fallback_html(self) -> str:
        """The static HTML shown where no kernel runs the JavaScript; each widget draws its own."""
        raise NotImplementedError(f"{type(self).__name__} must define _fallback_html()")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            data["text/html"] = self._fallback_html()
        return bundle


class TimelineWidget(_Live):
    """Programs and transfers per slice over time, coloured by tenant; queueing shown as
    a thin line from launch to start. ``last`` seconds of the log (``None``: all)."""

    _esm = _STATIC / "timeline.js"
    # Plain lists: validating each row would cost more than drawing it.
    rows: traitlets.List[Any] = traitlets.List().tag(sync=True)
    lanes: traitlets.List[Any] = traitlets.List().tag(sync=True)
    span_ms = traitlets.Float(0.0).tag(sync=True)

    def __init__(
        self,
        client: Client | None = None,
        last: float | None = None,
        live: bool = True,
        interval: float = 1.0,
        max_rows: int = 1000,
    ) -> None:
        if last is not None and (
            isinstance(last, bool) or not isinstance(last, int | float) or not last > 0
        ):
            raise ValueError(f"last is a window in seconds, > 0 (None: all the log); got {last!r}")
        self.last = last
        self.max_rows = max_rows
        self._cursor = 0
        horizon = None if last is None else last + 10.0
        self._tracker = Tracker(horizon, max_rows)
        super().__init__(client, live, interval)

    def refresh(self) -> None:
        # Only events logged since the last refresh cross the wire and get looked at.
        # The first look at a window of the last seconds reads only those seconds.
        horizon = self._tracker.horizon
        since = 0.0 if self._cursor or horizon is None else time.time() - horizon
        ev, self._cursor = self._client.event_rows(self._cursor, since=since)
        if not ev and self.rows and self.last is None:
            return  # nothing new to draw
        self._tracker.add(ev)
        records, lanes_ = self._tracker.records(self.last)
        self.rows = records
        self.lanes = lanes_
        self.span_ms = max(((r["end"] or r["start"]) for r in records), default=0.0)
        self.updated = time.time()

    def _fallback_html(self) -> str:
        return timeline_svg(self.rows, self.lanes)

    def __repr__(self) -> str:
        kinds = [r["kind"] for r in self.rows]
        window = "all of the log" if self.last is None else f"the last {self.last:g} s"
        return (
            f"<TimelineWidget: {kinds.count('program')} programs and {kinds.count('transfer')} "
            f"transfers on {len(self.lanes)} slices over {self.span_ms:.1f} ms ({window})>"
        )


class GraphWidget(anywidget.AnyWidget):
    """A dataflow graph drawn from its DOT source by the bundled Graphviz (WASM)."""

    _esm = _STATIC / "graph.js"
    dot = traitlets.Unicode("").tag(sync=True)
    nodes = traitlets.Int(0).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(self, graph: DataflowGraph | str) -> None:
        if isinstance(graph, DataflowGraph):
            super().__init__(dot=graph.to_dot(), nodes=len(graph.nodes), title=repr(graph))
        elif isinstance(graph, str):
            super().__init__(dot=graph, nodes=graph.count("[label="), title="")
        else:
            raise TypeError(
                f"GraphWidget draws a DataflowGraph or DOT source; got {type(graph).__name__}"
            )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            data["text/html"] = graph_html(self.dot, self.title)
        return bundle

    def __repr__(self) -> str:
        return f"<GraphWidget: {self.title or f'{self.nodes} nodes'}>"


def graph_html(dot: str, title: str = "") -> str:
    """Static SVG from the ``dot`` binary when it is installed, else the DOT source."""
    head = f"<p><code>{html.escape(title)}</code></p>" if title else ""
    if shutil.which("dot"):
        import graphviz

        try:
            return head + graphviz.Source(dot).pipe(format="svg").decode()
        except (graphviz.ExecutableNotFound, graphviz.CalledProcessError):
            pass
    return head + f"<pre>{html.escape(dot)}</pre>"


class StatusWidget(_Live):
    """``client.status()`` as live tables: islands, devices, slices, tenants, the newest
    events."""

    _esm = _STATIC / "status.js"
    html = traitlets.Unicode("").tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self, client: Client | None = None, live: bool = True, interval: float = 2.0
    ) -> None:
        super().__init__(client, live, interval)

    def refresh(self) -> None:
        # Straight from the snapshot's rows: its DataFrames (never built here) and their
        # to_html would cost the notebook's kernel ten times as much, every refresh.
        s = self._client.status()
        self.summary = s.summary
        t = s.rows
        events = [[_clock(e[0]), *e[1:]] for e in t["events"]]
        parts = [f"<p><b>{html.escape(self.summary)}</b></p>"]
        if s.quota_line:
            parts.append(f"<p>{html.escape(s.quota_line)}</p>")
        for name, columns in Status.COLUMNS.items():
            rows = events if name == "events" else t[name]
            parts.append(f"<h4>{'latest events' if name == 'events' else name}</h4>")
            parts.append(_html_table(columns, rows) if rows else "<p>none</p>")
        self.html = "".join(parts)
        self.updated = time.time()

    def _fallback_html(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"<StatusWidget: {self.summary}>"


class DevicesWidget(_Live):
    """The placement map: every device of every island, the slice that holds it and the
    program that last ran there."""

    _esm = _STATIC / "devices.js"
    devices: traitlets.List[Any] = traitlets.List().tag(sync=True)

    def __init__(
        self, client: Client | None = None, live: bool = True, interval: float = 2.0
    ) -> None:
        self._cursor = 0
        self._last: dict[str, str] = {}  # slice id -> the program that last started there
        super().__init__(client, live, interval)

    def refresh(self) -> None:
        t = self._client.status().rows
        ev, self._cursor = self._client.event_rows(self._cursor)
        for e in ev:  # time, kind, tenant, lid, program, slice, ...
            if e[1] == "start" and e[4] != "transfer":
                self._last[str(e[5])] = str(e[4])
        # Devices name the slice that holds them; the event log names slices by id.
        by_name = {x[1]: x[0] for x in t["slices"]}
        rows = []
        for island, _host, device, sname in t["devices"]:
            sid = by_name.get(sname, "")
            rows.append(
                {
                    "island": island,
                    "device": int(device),
                    "slice": sname,
                    "program": self._last.get(sid, "") if sname else "",
                }
            )
        self.devices = rows
        self.updated = time.time()

    def _fallback_html(self) -> str:
        df = pd.DataFrame(self.devices, columns=["island", "device", "slice", "program"])
        return df.to_html(index=False, border=0)

    def __repr__(self) -> str:
        held = sum(1 for d in self.devices if d["slice"])
        return f"<DevicesWidget: {len(self.devices)} devices, {held} held by slices>"


def _clock(t: float) -> str:
    """An event time as the status table shows it: UTC, to the microsecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}"


def _html_table(columns: tuple[str, ...], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f'<table class="dataframe"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
