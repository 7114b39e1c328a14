"""What the live views draw, computed from a client's snapshots.

Shared by the notebook's widgets (:mod:`pathways_nb.viz._widgets`) and JupyterLab's
Pathways panel (:mod:`pathways_nb.lab`), so both show the same tables, placement map
and timeline from the same rows. Nothing here touches a widget or a socket: each
function takes what ``client.status()`` and ``client.event_rows()`` return.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pathways_nb.client import EventRows, Status
from pathways_nb.viz._timeline import Tracker


def status_html(s: Status) -> str:
    """The status snapshot as HTML tables: the summary, the quotas, then islands,
    devices, slices, tenants and the newest events."""
    # Straight from the snapshot's rows: its DataFrames (never built here) and their
    # to_html would cost the caller ten times as much, every refresh.
    t = s.rows
    events = [[clock(e[0]), *e[1:]] for e in t["events"]]
    parts = [f"<p><b>{html.escape(s.summary)}</b></p>"]
    if s.quota_line:
        parts.append(f"<p>{html.escape(s.quota_line)}</p>")
    for name, columns in Status.COLUMNS.items():
        rows = events if name == "events" else t[name]
        parts.append(f"<h4>{'latest events' if name == 'events' else name}</h4>")
        parts.append(html_table(columns, rows) if rows else "<p>none</p>")
    return "".join(parts)


class PlacementRows:
    """The placement map's rows: every device, the slice that holds it and the program
    that last started on that slice, kept up to date from the event log's new rows."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}  # slice id -> the program that last started there

    def rows(self, s: Status, events: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """One dict per device (``island``, ``device``, ``slice``, ``program``), given
        a status snapshot and the events logged since the last call."""
        for e in events:  # time, kind, tenant, lid, program, slice, ...
            if e[1] == "start" and e[4] != "transfer":
                self._last[str(e[5])] = str(e[4])
        t = s.rows
        # Devices name the slice that holds them; the event log names slices by id.
        by_name = {x[1]: x[0] for x in t["slices"]}
        return [
            {
                "island": island,
                "device": int(device),
                "slice": sname,
                "program": self._last.get(by_name.get(sname, ""), "") if sname else "",
            }
            for island, _host, device, sname in t["devices"]
        ]


class TimelineRows:
    """The timeline's rows and lanes, kept from the event log's new rows only.

    ``last`` seconds of the log are drawn (``None``: all of it, up to ``max_rows``).
    """

    def __init__(self, last: float | None, max_rows: int) -> None:
        if last is not None and (
            isinstance(last, bool) or not isinstance(last, int | float) or not last > 0
        ):
            raise ValueError(f"last is a window in seconds, > 0 (None: all the log); got {last!r}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int):
            raise TypeError(
                "max_rows is how many programs and transfers the timeline draws at most, a "
                f"whole number such as 1000; got {type(max_rows).__name__} {max_rows!r}"
            )
        if max_rows < 1:
            raise ValueError(
                "max_rows is how many programs and transfers the timeline draws at most, "
                f"1 or more (with fewer it would draw nothing); got {max_rows}"
            )
        self.last = last
        self._cursor = 0
        self._tracker = Tracker(None if last is None else last + 10.0, max_rows)
        self.rows: list[dict[str, Any]] = []
        self.lanes: list[str] = []

    def update(
        self, event_rows: Callable[..., EventRows], names: Mapping[str, str] | None = None
    ) -> bool:
        """Read the events logged since the last update (``event_rows`` is a client's
        ``event_rows``); False when nothing changed. ``names`` (slice id -> name, as in
        ``client.status().rows["slices"]``) labels the lanes by slice name."""
        if names:
            self._tracker.name_slices(names)
        # Only events logged since the last update cross the wire and get looked at.
        # The first look at a window of the last seconds reads only those seconds.
        horizon = self._tracker.horizon
        since = 0.0 if self._cursor or horizon is None else time.time() - horizon
        ev, self._cursor = event_rows(self._cursor, since=since)
        if not ev and self.rows and self.last is None:
            return False  # nothing new to draw
        self._tracker.add(ev)
        self.rows, self.lanes = self._tracker.records(self.last)
        return True

    @property
    def span_ms(self) -> float:
        """Milliseconds from the first launch drawn to the last start or end."""
        return max(((r["end"] or r["start"]) for r in self.rows), default=0.0)


def clock(t: float) -> str:
    """An event time as the status table shows it: UTC, to the microsecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}"


def html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as an HTML table of class ``dataframe`` (as pandas writes one), escaped."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f'<table class="dataframe"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
