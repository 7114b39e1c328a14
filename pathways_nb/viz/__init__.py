"""Seeing what runs: timelines, dataflow graphs, cluster status, Perfetto traces.

Every ``%pathways`` magic has its function here:

>>> pw.viz.timeline(client, last=5.0)     # %pathways timeline --last 5s
>>> pw.viz.graph(step, state, batch)       # %pathways graph step(state, batch)
>>> pw.viz.status(client)                  # %pathways status
>>> pw.viz.devices(client)                 # %pathways devices
>>> pw.viz.write_trace(client.events(), "step.json")   # %pathways trace step.json

What the live views draw is public too: :func:`status_html`, :class:`PlacementRows` and
:class:`TimelineRows` compute it from a client's snapshots, for JupyterLab's Pathways
panel (``pathways-nb lab``) and for dashboards of your own.

This package uses only the client's public API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pathways_nb.viz._timeline import intervals, parse_duration
from pathways_nb.viz._trace import trace_events, write_trace
from pathways_nb.viz._views import PlacementRows, TimelineRows, status_html
from pathways_nb.viz._widgets import (
    DevicesWidget,
    GraphWidget,
    StatusWidget,
    TimelineWidget,
    graph_html,
)

T = TypeVar("T")


def timeline(client: Any = None, last: float | None = None, live: bool = True) -> TimelineWidget:
    """A live timeline of the last ``last`` seconds (``None``: the whole log)."""
    return TimelineWidget(client, last=last, live=live)


def status(client: Any = None, live: bool = True) -> StatusWidget:
    """A live view of ``client.status()``."""
    return StatusWidget(client, live=live)


def devices(client: Any = None, live: bool = True) -> DevicesWidget:
    """A live placement map: device → slice → program."""
    return DevicesWidget(client, live=live)


def graph(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GraphWidget:
    """The dataflow graph of ``fn(*args, **kwargs)`` (traced from shapes), drawn."""
    from pathways_nb.client import Client

    return GraphWidget(Client.current().graph(fn, *args, **kwargs))


def progress(
    iterable: Iterable[T], client: Any = None, last: float | None = 10.0, **tqdm_kwargs: Any
) -> Iterator[T]:
    """``tqdm.notebook`` over ``iterable`` with a live timeline shown beneath it.

    >>> for step in pw.viz.progress(range(1000)):
    ...     params, loss = train(params, batch)
    """
    from IPython.display import display
    from tqdm.auto import tqdm

    bar = tqdm(iterable, **tqdm_kwargs)
    view = TimelineWidget(client, last=last)
    display(view)
    try:
        yield from bar
    finally:
        view.stop()
        view.refresh()


__all__ = [
    "DevicesWidget",
    "GraphWidget",
    "PlacementRows",
    "StatusWidget",
    "TimelineRows",
    "TimelineWidget",
    "devices",
    "graph",
    "graph_html",
    "intervals",
    "parse_duration",
    "progress",
    "status",
    "status_html",
    "timeline",
    "trace_events",
    "write_trace",
]


def __dir__() -> list[str]:
    # Tab completion lists dir(): the public names, not the typing helpers imported here.
    return __all__
