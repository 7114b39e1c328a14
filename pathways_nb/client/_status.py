"""Status snapshots as pandas DataFrames with a readable repr."""

from __future__ import annotations

import dataclasses
from typing import Any

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

        islands, devices = [], []
        owner: dict[tuple[str, int], str] = {}
        for sl in s["slices"]:
            if sl["state"] == "active":
                for d in sl["devices"]:
                    owner[(sl["host"], d)] = sl["name"]
        for h in s["hosts"]:
            islands.append(
                {
                    "island": h["island"],
                    "host": h["host"],
                    "alive": h["alive"],
                    "platform": h["platform"],
                    "process": h["process"],
                    "devices": len(h["devices"]),
                    "free": len(h["devices"]) - len(h["used"]) if h["alive"] else 0,
                    "queued": s["queued"].get(h["island"], 0),
                }
            )
            for d in h["devices"]:
                devices.append(
                    {
                        "island": h["island"],
                        "host": h["host"],
                        "device": d,
                        "slice": owner.get((h["host"], d), ""),
                    }
                )
        slices = pd.DataFrame(
            [
                {
                    "slice": x["slice"],
                    "name": x["name"],
                    "tenant": x["tenant"],
                    "mesh": x["mesh"],
                    "island": x["island"],
                    "host": x["host"],
                    "devices": x["devices"],
                    "state": x["state"],
                }
                for x in s["slices"]
            ],
            columns=["slice", "name", "tenant", "mesh", "island", "host", "devices", "state"],
        )
        return Status(
            islands=pd.DataFrame(
                islands,
                columns=[
                    "island",
                    "host",
                    "alive",
                    "platform",
                    "process",
                    "devices",
                    "free",
                    "queued",
                ],
            ),
            devices=pd.DataFrame(devices, columns=["island", "host", "device", "slice"]),
            slices=slices,
            tenants=pd.DataFrame(
                s["tenants"],
                columns=["tenant", "name", "weight", "launches", "pending", "device_seconds"],
            ),
            events=events_frame(s.get("events") or []),
            queued=dict(s["queued"]),
            inflight=dict(s["inflight"]),
            events_total=int(s["events_total"]),
            window=int(s["window"]),
        )

    def __repr__(self) -> str:
        n_dev = len(self.devices)
        used = int((self.devices["slice"] != "").sum()) if n_dev else 0
        lines = [
            f"pathways_nb cluster: {len(self.islands)} islands, "
            f"{n_dev} devices ({used} in slices), "
            f"{len(self.slices)} slices, {len(self.tenants)} tenants, window {self.window}",
            "",
            "islands:",
            self.islands.to_string(index=False) if len(self.islands) else "  (none)",
            "",
            "slices:",
            self.slices.to_string(index=False) if len(self.slices) else "  (none)",
        ]
        return "\n".join(lines)


def events_frame(rows: list[list[Any]]) -> Any:
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(FIELDS))
    df["time"] = pd.to_datetime(df["time"], unit="s")
    return df
