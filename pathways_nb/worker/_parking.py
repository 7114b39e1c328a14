"""Work that cannot start yet: a launch or a send whose input has not arrived.

A host's dispatch thread never blocks on a missing input: a transfer that feeds it may
sit behind other work in another island's queue, and a blocked thread here could hold
up the very send it waits for (two pipelines crossing two islands in opposite orders).
Instead the item is *parked* and the queue moves on. Later work that touches a parked
item's arrays parks behind it, so per-array order (read before donate, produce before
consume, consume before drop) is what the gang scheduler sent. One host is one island
here and one launch covers all its devices, so programs that do not share arrays may
pass each other without any device seeing a different collective order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any


@dataclasses.dataclass
class Parked:
    kind: str
    body: Any
    touched: tuple[int, ...]
    # When the inputs it waits for are declared lost.
    deadline: float


class ParkingLot:
    """Parked items in arrival order and the arrays they hold back."""

    def __init__(self) -> None:
        self.items: list[Parked] = []
        self._blocked: set[int] = set()
        # The earliest deadline, kept as items come and go: the dispatch loop asks for
        # it on every wake-up.
        self._earliest: float | None = None

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def conflicts(self, touched: Iterable[int]) -> bool:
        """Whether work touching these arrays must wait behind a parked item."""
        return bool(self._blocked) and not self._blocked.isdisjoint(touched)

    def park(self, kind: str, body: Any, touched: tuple[int, ...], deadline: float) -> None:
        self.repark(Parked(kind, body, touched, deadline))

    def repark(self, item: Parked) -> None:
        """Put back an item :meth:`take_all` gave out (or park a new one)."""
        self.items.append(item)
        self._blocked.update(item.touched)
        if self._earliest is None or item.deadline < self._earliest:
            self._earliest = item.deadline

    def take_all(self) -> list[Parked]:
        """Everything parked, oldest first, to be tried again in that order."""
        items, self.items = self.items, []
        self._blocked = set()
        self._earliest = None
        return items

    def remove(self, pred: Callable[[Parked], bool]) -> list[Parked]:
        """Take out the items ``pred`` selects; the rest keep their order."""
        out = [p for p in self.items if pred(p)]
        if out:
            self.items = [p for p in self.items if not pred(p)]
            self._blocked = {h for p in self.items for h in p.touched}
            self._earliest = min((p.deadline for p in self.items), default=None)
        return out

    def earliest_deadline(self) -> float | None:
        return self._earliest

    def seconds_to_deadline(self) -> float | None:
        d = self.earliest_deadline()
        return None if d is None else max(0.0, d - time.monotonic())
