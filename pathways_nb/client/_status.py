"""Status snapshots as pandas DataFrames with a readable repr, and the event log's rows."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, ClassVar, NamedTuple

import numpy as np

FIELDS = ("time", "kind", "tenant", "lid", "program", "slice", "island", "host", "detail")
ISLAND_COLUMNS = (
    "island",
    "host",
    "alive",
    "platform",
    "process",
    "devices",
    "free",
    "queued",
    # The bytes of the arrays its host keeps (every tenant's, as of its last heartbeat)
    # and its PATHWAYS_STORE_LIMIT_BYTES (0: none).
    "store_bytes",
    "store_limit",
)
DEVICE_COLUMNS = ("island", "host", "device", "slice")
SLICE_COLUMNS = (
    "slice",
    "name",
    "tenant",
    "mesh",
    # Its axes' jax.sharding.AxisType: "Auto", "Explicit" or "Manual" for all of them, or
    # one per axis, comma-separated.
    "axis_types",
    "island",
    "host",
    "devices",
    "state",
)
TENANT_COLUMNS = (
    "tenant",
    "name",
    "weight",
    "launches",
    "pending",
    "device_seconds",
    "devices",
    "store_bytes",
)


@dataclasses.dataclass(frozen=True)
class Status:
    """``client.status()``: a snapshot of islands, devices, slices, tenants and the newest
    events.

    ``islands``, ``devices``, ``slices``, ``tenants`` and ``events`` are pandas
    DataFrames, built on first use; ``rows`` holds the same tables as plain lists (in
    :data:`COLUMNS` order), which live views draw without building DataFrames.
    ``summary`` is the repr's first line.

    >>> s = client.status()
    >>> s.islands[["island", "free"]]
    >>> s.rows["slices"][0][s.COLUMNS["slices"].index("mesh")]
    """

    COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {
        "islands": ISLAND_COLUMNS,
        "devices": DEVICE_COLUMNS,
        "slices": SLICE_COLUMNS,
        "tenants": TENANT_COLUMNS,
        "events": FIELDS,
    }

    rows: dict[str, list[list[Any]]]
    queued: dict[str, int]
    inflight: dict[str, int]
    events_total: int
    window: int
    # The cluster's quotas per client: ``max_devices`` its slices may hold together and
    # ``store_bytes`` its arrays may take on one host (0: no quota).
    quotas: dict[str, int] = dataclasses.field(default_factory=dict)
    # DataFrames built so far, by table (the snapshot itself never changes).
    _frames: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def from_reply(s: dict[str, Any]) -> Status:
        return Status(
            rows=tables(s),
            queued=dict(s["queued"]),
            inflight=dict(s["inflight"]),
            events_total=int(s["events_total"]),
            window=int(s["window"]),
            quotas={k: int(v) for k, v in (s.get("quotas") or {}).items()},
        )

    def _frame(self, name: str) -> Any:
        df = self._frames.get(name)
        if df is None:
            import pandas as pd

            if name == "events":
                df = events_frame(self.rows["events"])
            else:
                df = pd.DataFrame(self.rows[name], columns=list(self.COLUMNS[name]))
            self._frames[name] = df
        return df

    @property
    def islands(self) -> Any:
        """One row per island: its host, whether it is alive, its devices and queue."""
        return self._frame("islands")

    @property
    def devices(self) -> Any:
        """One row per device: its island, host and the slice that holds it ("" if free)."""
        return self._frame("devices")

    @property
    def slices(self) -> Any:
        """One row per slice: its mesh, island, devices and state."""
        return self._frame("slices")

    @property
    def tenants(self) -> Any:
        """One row per client: its weight, launches, pending launches, device time, the
        devices its slices hold and the bytes its arrays take on the hosts (as of their
        last heartbeat, once a second)."""
        return self._frame("tenants")

    @property
    def events(self) -> Any:
        """The newest events of the log (the columns of ``client.events()``)."""
        return self._frame("events")

    @property
    def summary(self) -> str:
        """Counts of live islands, their devices (and those in slices), slices and
        tenants. A host that died stays in the tables (``alive`` False) but is not
        counted: its island, restarted, is counted once."""
        live = [r for r in self.rows["islands"] if r[2]]
        hosts = {r[1] for r in live}
        return summary_line(
            len({r[0] for r in live}),
            [d[3] for d in self.rows["devices"] if d[1] in hosts],
            len(self.rows["slices"]),
            len(self.rows["tenants"]),
            self.window,
        )

    def __repr__(self) -> str:
        lines = [
            self.summary,
            "",
            "islands:",
            self.islands.to_string(index=False) if len(self.islands) else "  (none)",
            "",
            "slices:",
            self.slices.to_string(index=False) if len(self.slices) else "  (none)",
        ]
        if self.quota_line:
            lines[1:1] = [self.quota_line]
        return "\n".join(lines)

    @property
    def quota_line(self) -> str:
        """The cluster's quotas per client in a line, or "" where it sets none."""
        quotas = [
            f"{n} {what}"
            for n, what in (
                (self.quotas.get("max_devices", 0), "devices"),
                (self.quotas.get("store_bytes", 0), "bytes of arrays per host"),
            )
            if n
        ]
        return f"quotas per client: {', '.join(quotas)}" if quotas else ""


class EventRows(NamedTuple):
    """Events logged after a cursor (``client.event_rows(after)``): ``rows`` in
    :data:`FIELDS` order, times as seconds since the epoch, and ``next``, the cursor
    to pass next time."""

    rows: list[list[Any]]
    next: int


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
                h.get("store_bytes", 0),
                h.get("store_limit", 0),
            ]
        )
        for d in h["devices"]:
            devices.append([h["island"], h["host"], d, owner.get((h["host"], d), "")])
    return {
        "islands": islands,
        "devices": devices,
        "slices": [
            [_axis_types(x.get(c)) if c == "axis_types" else x[c] for c in SLICE_COLUMNS]
            for x in s["slices"]
        ],
        "tenants": [[x[c] for c in TENANT_COLUMNS] for x in s["tenants"]],
        "events": list(s.get("events") or []),
    }


def _axis_types(names: Any) -> str:
    """A slice's axis types as one word where all are the same ("Auto" where unknown)."""
    names = list(names or ())
    if not names:
        return "Auto"
    return names[0] if len(set(names)) == 1 else ", ".join(names)


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
