"""Status snapshots as pandas DataFrames with a readable repr."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import numpy as np

FIELDS = ("time", "kind", "tenant", "lid", "program", "slice", "island", "host", "detail")


@dataclasses.dataclass(frozen=True)
class Status:
    """``client.status()``: islands, devices, slices, tenants and the newest events as
    DataFrames."""

    islands: Any
    devices: Any
    slices: Any
    tenants: Any
    events: Any
    queued: dict[str, int]
    inflight: dict[str, int]
    events_total: int
    window: int

    @staticmethod
    def from_reply(s: dict[str, Any]) -> Status:
        import pandas as pd

        t = tables(s)
        return Status(
            islands=pd.DataFrame(t["islands"], columns=list(ISLAND_COLUMNS)),
            devices=pd.DataFrame(t["devices"], columns=list(DEVICE_COLUMNS)),
            slices=pd.DataFrame(t["slices"], columns=list(SLICE_COLUMNS)),
            tenants=pd.DataFrame(t["tenants"], columns=list(TENANT_COLUMNS)),
            events=events_frame(t["events"]),
            queued=dict(s["queued"]),
            inflight=dict(s["inflight"]),
            events_total=int(s["events_total"]),
            window=int(s["window"]),
        )

    def __repr__(self) -> str:
        lines = [
            summary_line(
                len(self.islands),
                list(self.devices["slice"]),
                len(self.slices),
                len(self.tenants),
                self.window,
            ),
            "",
            "islands:",
            self.islands.to_string(index=False) if len(self.islands) else "  (none)",
            "",
            "slices:",
            self.slices.to_string(index=False) if len(self.slices) else "  (none)",
        ]
        return "\n".join(lines)


ISLAND_COLUMNS = ("island", "host", "alive", "platform", "process", "devices", "free", "queued")
DEVICE_COLUMNS = ("island", "host", "device", "slice")
SLICE_COLUMNS = ("slice", "name", "tenant", "mesh", "island", "host", "devices", "state")
TENANT_COLUMNS = ("tenant", "name", "weight", "launches", "pending", "device_seconds")


def tables(s: dict[str, Any]) -> dict[str, list[Any]]:
    """The rows of a status reply's tables, as plain lists (the columns above; events in
    the event log's FIELDS). Live widgets draw these without building DataFrames."""
    islands, devices = [], []
    owner: dict[tuple[str, int], str] = {}
    for sl in s["slices"]:
        if sl["state"] == "active":
            for d in sl["devices"]:
                owner[(sl["host"], d)] = sl["name"]
    for h in s["hosts"]:
        free = len(h["devices"]) - len(h["used"]) if h["alive"] else 0
        islands.append(
            [
                h["island"],
                h["host"],
                h["alive"],
                h["platform"],
                h["process"],
                len(h["devices"]),
                free,
                s["queued"].get(h["island"], 0),
            ]
        )
        for d in h["devices"]:
            devices.append([h["island"], h["host"], d, owner.get((h["host"], d), "")])
    return {
        "islands": islands,
        "devices": devices,
        "slices": [[x[c] for c in SLICE_COLUMNS] for x in s["slices"]],
        "tenants": [[x[c] for c in TENANT_COLUMNS] for x in s["tenants"]],
        "events": list(s.get("events") or []),
    }


def summary_line(
    islands: int, device_slices: list[str], slices: int, tenants: int, window: int
) -> str:
    """The first line of a status repr: counts of islands, devices, slices, tenants."""
    used = sum(1 for x in device_slices if x)
    return (
        f"pathways_nb cluster: {islands} islands, {len(device_slices)} devices "
        f"({used} in slices), {slices} slices, {tenants} tenants, window {window}"
    )


def events_frame(rows: list[list[Any]]) -> Any:
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(FIELDS))
    df["time"] = pd.to_datetime(df["time"], unit="s")
    return df


def epoch_seconds(since: Any) -> float:
    """``events(since=...)`` as seconds since the epoch."""
    if isinstance(since, bool):
        raise TypeError(f"since is a time, not a bool; got {since!r}")
    if isinstance(since, int | float | np.integer | np.floating):
        return float(since)
    if isinstance(since, np.datetime64):
        return float(since.astype("datetime64[ns]").astype(np.int64)) / 1e9
    if isinstance(since, datetime.datetime):
        # Naive times are UTC, as the event frame's own are (pd.Timestamp reads them so).
        aware = since if since.tzinfo is not None else since.replace(tzinfo=datetime.UTC)
        return aware.timestamp()
    raise TypeError(
        "since is seconds since the epoch (time.time()) or a datetime, pd.Timestamp or "
        f"np.datetime64 (naive ones are UTC); got {type(since).__name__} {since!r}"
    )
