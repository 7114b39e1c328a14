"""The event log as intervals: one row per program or transfer, with its queueing.

Everything here is a pure function of an event-log DataFrame (``client.events()``), so
the timeline widget, its HTML fallback and the Perfetto export draw the same thing.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Mapping
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

_TRANSFER = r"^(?P<src>\S+)→(?P<dst>\S+)(?: (?P<bytes>\d+) B)?"


def intervals(events: pd.DataFrame | None) -> pd.DataFrame:
    """One row per launch that started: when it was submitted, started and ended.

    A launch still running has ``end`` NaN; one never started is left out.
    """
    if events is None or len(events) == 0:
        return pd.DataFrame(columns=COLUMNS)
    ev = events[events.lid > 0]
    ev = ev.assign(t=ev.time.astype("int64") / 1e9)
    launch = ev[ev.kind == "launch"].drop_duplicates("lid").set_index("lid")
    start = ev[ev.kind == "start"].drop_duplicates("lid").set_index("lid")
    end = ev[ev.kind.isin(["end", "error"])].drop_duplicates("lid").set_index("lid")
    if len(start) == 0:
        return pd.DataFrame(columns=COLUMNS)
    df = start[["tenant", "program", "slice", "island", "host", "t"]].join(
        launch[["t", "detail"]].rename(columns={"t": "launch", "detail": "launch_detail"})
    )
    df = df.join(end[["t", "kind", "detail"]].rename(columns={"t": "end", "kind": "end_kind"}))
    is_transfer = df.program == "transfer"
    detail = df.detail.where(df.detail.notna(), df.launch_detail).fillna("").astype(str)
    parsed = detail.str.extract(_TRANSFER)
    out = pd.DataFrame(
        {
            "lid": df.index.astype("int64"),
            "tenant": df.tenant.astype("int64").to_numpy(),
            "kind": is_transfer.map({True: "transfer", False: "program"}).to_numpy(),
            "name": df.program.astype(str).to_numpy(),
            "slice": df.slice.astype(str).to_numpy(),
            "island": df.island.astype(str).to_numpy(),
            "host": df.host.astype(str).to_numpy(),
            "source": parsed.src.where(is_transfer, "").fillna("").to_numpy(),
            "bytes": pd.to_numeric(parsed.bytes.where(is_transfer), errors="coerce")
            .fillna(0)
            .astype("int64")
            .to_numpy(),
            "launch": df.launch.fillna(df.t).astype(float).to_numpy(),
            "start": df.t.astype(float).to_numpy(),
            "end": df.end.astype(float).to_numpy(),
            "failed": (df.end_kind == "error").to_numpy(),
        },
        columns=COLUMNS,
    )
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


class Tracker:
    """Follows the event log incrementally: each :meth:`add` costs only the new events,
    each :meth:`records` only the launches in the window. For live widgets."""

    def __init__(self, horizon: float | None, max_rows: int) -> None:
        self.horizon = horizon  # seconds of history kept (None: up to max_rows)
        self.max_rows = max_rows
        self._recs: dict[int, dict[str, Any]] = {}
        self._names: dict[str, str] = {}  # slice id -> the name it was allocated with

    def name_slices(self, names: Mapping[str, str]) -> None:
        """Slice names by slice id, for the lanes (the event log names slices by id, and
        its ``allocate`` events, which carry the names, may be older than the window)."""
        self._names.update({str(k): str(v) for k, v in names.items()})

    def add(self, events: list[list[Any]]) -> None:
        """New events as the controller sends them: rows of the event log's fields, time
        in seconds first (what ``client.events()`` turns into a DataFrame)."""
        for t, kind, tenant, lid, program, slice_, island, host, detail in events:
            if kind == "allocate" and slice_:
                # Its detail is the slice's name, then its mesh: "train {'x': 2}".
                name, sep, _ = str(detail).rpartition(" {")
                if sep:
                    self._names[str(slice_)] = name
                continue
            if lid <= 0 or kind not in ("launch", "start", "end", "error"):
                continue
            r = self._recs.get(lid)
            if r is None:
                r = self._recs[lid] = {"lid": int(lid), "launch": None, "start": None, "end": None}
            if kind == "launch":
                r["launch"] = t
            elif kind == "start":
                r.update(
                    tenant=int(tenant),
                    name=str(program),
                    lane=(str(island), str(slice_)),
                    host=str(host),
                    start=t,
                )
            else:
                r["end"] = t
                r["failed"] = kind == "error"
            if program == "transfer" and detail:
                m = re.match(_TRANSFER, str(detail))
                if m:
                    r["source"] = m.group("src")
                    if m.group("bytes"):
                        r["bytes"] = int(m.group("bytes"))
        self._trim()

    def _trim(self) -> None:
        if self.horizon is not None:
            cutoff = time.time() - self.horizon
            old = [k for k, r in self._recs.items() if r["end"] is not None and r["end"] < cutoff]
            for k in old:
                del self._recs[k]
        excess = len(self._recs) - 3 * self.max_rows
        if excess > 0:
            for k in list(self._recs)[:excess]:
                del self._recs[k]

    def records(self, last: float | None) -> tuple[list[dict[str, Any]], list[str]]:
        """The started launches overlapping the last ``last`` seconds, times in ms."""
        now = time.time()
        t0 = now - last if last is not None else float("-inf")
        rows = [
            r
            for r in self._recs.values()
            if r["start"] is not None and (r["end"] is None or r["end"] >= t0)
        ]
        rows.sort(key=lambda r: (r["start"], r["lid"]))
        rows = rows[-self.max_rows :]
        if not rows:
            return [], []
        base = min((r["launch"] or r["start"]) for r in rows)
        labels = self._lane_labels({r["lane"] for r in rows})
        out = []
        for r in rows:
            out.append(
                {
                    "lid": r["lid"],
                    "tenant": r["tenant"],
                    "kind": "transfer" if r["name"] == "transfer" else "program",
                    "name": r["name"],
                    "lane": labels[r["lane"]],
                    "host": r["host"],
                    "source": r.get("source", ""),
                    "bytes": r.get("bytes", 0),
                    "launch": round(((r["launch"] or r["start"]) - base) * 1e3, 3),
                    "start": round((r["start"] - base) * 1e3, 3),
                    "end": None if r["end"] is None else round((r["end"] - base) * 1e3, 3),
                    "failed": bool(r.get("failed", False)),
                }
            )
        return out, sorted(labels.values())

    def _lane_labels(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Each lane's label, ``island/name`` (``island/id`` for a slice whose name is not
        known); two slices drawn under one label (two tenants' ``train``) keep their ids."""
        names = {k: self._names.get(k[1], k[1]) for k in keys}
        labels = {k: f"{k[0]}/{name}" for k, name in names.items()}
        shared = collections.Counter(labels.values())
        return {
            k: f"{label} ({k[1]})" if shared[label] > 1 and names[k] != k[1] else label
            for k, label in labels.items()
        }
