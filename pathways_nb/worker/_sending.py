"""Source arrays that sends to other hosts are still reading.

A launch may not donate an array while a send reads it: XLA would reuse the buffer
under the send. Such a launch parks, and the end of the last send of that array wakes
the parking lot; ends of sends no launch waits for wake nothing, so a host streaming
arrays out does not stir its lot on every send.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence


class SendsInFlight:
    """Counts the sends reading each source array.

    ``cv`` is the executor's condition: the check a launch makes before it parks and the
    end of a send both take it, so no send ends unseen in between. ``wake`` is called
    with it held when a send a launch waits for has ended.
    """

    def __init__(self, cv: threading.Condition, wake: Callable[[], None]) -> None:
        self._cv = cv
        self._wake = wake
        self._reading: collections.Counter[int] = collections.Counter()
        self._waited: set[int] = set()

    def started(self, src: int) -> None:
        """A send of ``src`` begins (called by the dispatch thread)."""
        with self._cv:
            self._reading[src] += 1

    def finished(self, src: int) -> None:
        """A send finished reading ``src`` (called by the sending thread)."""
        with self._cv:
            if src not in self._reading:
                return
            self._reading[src] -= 1
            if self._reading[src] <= 0:
                del self._reading[src]
                if src in self._waited:
                    self._waited.discard(src)
                    self._wake()

    def blocks(self, ins: Sequence[int], donate: Sequence[int]) -> bool:
        """Whether a launch with inputs ``ins`` donating positions ``donate`` must wait
        for a send; if so, the end of that send wakes the lot."""
        if not self._reading or not donate:
            return False
        with self._cv:
            busy = [src for src in (ins[i] for i in donate) if src in self._reading]
            self._waited.update(busy)
        return bool(busy)
