"""The event log: every launch, start, end, transfer and failure, in a bounded ring."""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any

FIELDS = ("time", "kind", "tenant", "lid", "program", "slice", "island", "host", "detail")


class EventLog:
    """A ring buffer of event tuples; old events fall off so memory stays bounded."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the event log needs room for at least one event; got {size}")
        self._ring: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=size)
        self.total = 0

    def add(
        self,
        kind: str,
        tenant: int = 0,
        lid: int = 0,
        program: str = "",
        slice: str = "",
        island: str = "",
        host: str = "",
        detail: str = "",
        at: float | None = None,
    ) -> None:
        self._ring.append(
            (
                time.time() if at is None else at,
                kind,
                tenant,
                lid,
                program,
                slice,
                island,
                host,
                detail,
            )
        )
        self.total += 1

    def since(self, t: float, tenant: int | None = None, limit: int = 100_000) -> list[list[Any]]:
        """Events at or after ``t`` (oldest first), optionally only one tenant's."""
        # Host-reported times can arrive out of order, so filter instead of stopping early.
        out = [
            list(ev) for ev in self._ring if ev[0] >= t and (tenant is None or ev[2] in (0, tenant))
        ]
        return out[-limit:]

    def after(
        self, seq: int, tenant: int | None = None, limit: int = 100_000, since: float = 0.0
    ) -> tuple[list[list[Any]], int]:
        """Events logged after the ``seq``-th (oldest first) and at or after time
        ``since``, and the number to ask with next time. Events are numbered in the order
        they were logged, from 0; those that fell off the ring are gone."""
        first = self.total - len(self._ring)  # the number of the oldest event kept
        # Walk in from the newest end: live views ask for the last few of a full ring.
        newest = list(itertools.islice(reversed(self._ring), max(0, self.total - max(seq, first))))
        newest.reverse()
        out = [
            list(ev) for ev in newest if (tenant is None or ev[2] in (0, tenant)) and ev[0] >= since
        ]
        return out[-limit:], self.total

    def __len__(self) -> int:
        return len(self._ring)
