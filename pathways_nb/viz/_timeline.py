"""The event log as intervals: one row per program or transfer, with its queueing.

Everything here is a pure function of an event-log DataFrame (``client.events()``), so
the timeline widget, its HTML fallback and the Perfetto export draw the same thing.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

COLUMNS = [
    "lid",
    "tenant",
    "kind",  # "program" | "transfer"
    "name",
    "slice",
    "island",
    "host",
    "source",  # a transfer's source host ("" for programs)
    "bytes",
    "launch",  # seconds since the epoch
    "start",
    "end",
    "failed",
]

_TRANSFER = re.compile(r"^(?P<src>\S+)→(?P<dst>\S+)(?: (?P<bytes>\d+) B)?")


def intervals(events: pd.DataFrame) -> pd.DataFrame:
    """One row per launch that started: when it was submitted, started and ended.

    A launch still running has ``end`` NaN; one never started is left out.
    """
    if events is None or len(events) == 0:
        return pd.DataFrame(columns=COLUMNS)
    ev = events[events.lid > 0]
    t = ev.time.map(lambda v: v.timestamp()) if len(ev) else ev.time
    ev = ev.assign(t=t)
    launch = ev[ev.kind == "launch"].drop_duplicates("lid").set_index("lid")
    start = ev[ev.kind == "start"].drop_duplicates("lid").set_index("lid")
    end = ev[ev.kind.isin(["end", "error"])].drop_duplicates("lid").set_index("lid")
    rows = []
    for lid, s in start.iterrows():
        e = end.loc[lid] if lid in end.index else None
        la = launch.loc[lid] if lid in launch.index else None
        detail = str(e.detail) if e is not None else (str(la.detail) if la is not None else "")
        m = _TRANSFER.match(detail)
        is_transfer = s.program == "transfer"
        rows.append(
            {
                "lid": int(lid),
                "tenant": int(s.tenant),
                "kind": "transfer" if is_transfer else "program",
                "name": str(s.program),
                "slice": str(s.slice),
                "island": str(s.island),
                "host": str(s.host),
                "source": m.group("src") if (is_transfer and m) else "",
                "bytes": int(m.group("bytes")) if (is_transfer and m and m.group("bytes")) else 0,
                "launch": float(la.t) if la is not None else float(s.t),
                "start": float(s.t),
                "end": float(e.t) if e is not None else float("nan"),
                "failed": bool(e is not None and e.kind == "error"),
            }
        )
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(["start", "lid"]).reset_index(drop=True)


def window(rows: pd.DataFrame, last: float | None, now: float | None = None) -> pd.DataFrame:
    """The rows that overlap the ``last`` seconds before ``now`` (default: the last end)."""
    if last is None or len(rows) == 0:
        return rows
    t1 = now if now is not None else float(rows[["start", "end"]].max().max())
    t0 = t1 - last
    ends = rows.end.fillna(t1)
    return rows[(ends >= t0) & (rows.start <= t1)].reset_index(drop=True)


def parse_duration(text: str) -> float:
    """``"5s"``, ``"250ms"``, ``"2m"`` or a plain number of seconds, as seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min)?\s*", text)
    if not m:
        raise ValueError(
            f"a duration is a number with an optional unit (ms, s, m), e.g. 5s or 250ms; "
            f"got {text!r}"
        )
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}[unit]


def lanes(rows: pd.DataFrame) -> list[str]:
    """Timeline lanes, one per slice, ordered by island then slice."""
    if len(rows) == 0:
        return []
    keys = rows[["island", "slice"]].drop_duplicates().sort_values(["island", "slice"])
    return [f"{i}/{s}" for i, s in zip(keys.island, keys.slice, strict=True)]


def to_records(rows: pd.DataFrame, t0: float | None = None) -> list[dict[str, Any]]:
    """Rows as JSON-able dicts with times in milliseconds after ``t0`` (for widgets)."""
    if len(rows) == 0:
        return []
    base = t0 if t0 is not None else float(rows.launch.min())
    out = []
    for r in rows.itertuples(index=False):
        out.append(
            {
                "lid": int(r.lid),
                "tenant": int(r.tenant),
                "kind": r.kind,
                "name": r.name,
                "lane": f"{r.island}/{r.slice}",
                "host": r.host,
                "source": r.source,
                "bytes": int(r.bytes),
                "launch": round((r.launch - base) * 1e3, 3),
                "start": round((r.start - base) * 1e3, 3),
                "end": None if r.end != r.end else round((r.end - base) * 1e3, 3),
                "failed": bool(r.failed),
            }
        )
    return out
