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

from pathways_nb.client import Client, DataflowGraph, EventRows
from pathways_nb.viz._svg import timeline_svg
from pathways_nb.viz._views import PlacementRows, TimelineRows, status_html

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
        if client is not None and not isinstance(client, Client):
            hint = f"pw.Client({client!r})" if isinstance(client, str) else "a pw.Client"
            raise TypeError(
                f"{type(self).__name__} shows a pw.Client's cluster; got "
                f"{type(client).__name__} {client!r:.80}. Pass {hint}, or nothing for the "
                "current client"
            )
        super().__init__(**kw)
        self._client = client or Client.current()
        self._closed = False
        if interval < 0.05:
            raise ValueError(f"refresh interval must be at least 0.05 s; got {interval}")
        self._refresher = _Refresher(self, interval)
        self.refresh()
        if live:
            self._refresher.start()

    def _event_rows(self, after: int, since: float = 0.0) -> EventRows:
        # An observer runs nothing of its own: its views show every tenant's work.
        return self._client.event_rows(after, since, all_tenants=self._client.observer)

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
        self._timeline = TimelineRows(last, max_rows)
        self.last = last
        self.max_rows = max_rows
        super().__init__(client, live, interval)

    def refresh(self) -> None:
        # This client's own slices by name; other tenants' are named by their allocations.
        names = {vs.id: vs.name for vs in self._client.slices}
        if not self._timeline.update(self._event_rows, names):
            return
        self.rows = self._timeline.rows
        self.lanes = self._timeline.lanes
        self.span_ms = self._timeline.span_ms
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
        s = self._client.status()
        self.summary = s.summary
        self.html = status_html(s)
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
        self._placement = PlacementRows()
        super().__init__(client, live, interval)

    def refresh(self) -> None:
        s = self._client.status()
        ev, self._cursor = self._event_rows(self._cursor)
        self.devices = self._placement.rows(s, ev)
        self.updated = time.time()

    def _fallback_html(self) -> str:
        df = pd.DataFrame(self.devices, columns=["island", "device", "slice", "program"])
        return df.to_html(index=False, border=0)

    def __repr__(self) -> str:
        held = sum(1 for d in self.devices if d["slice"])
        return f"<DevicesWidget: {len(self.devices)} devices, {held} held by slices>"
