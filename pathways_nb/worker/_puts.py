"""Puts that did not fit, held until the controller's note for them.

A put travels from the client straight to the host; the deletions the client sent before
it travel through the controller, behind the launches queued before them. So a put made
right after ``del x`` can reach a full store before ``x`` has gone. The client sends a
note of every put to the controller, after its deletions; the controller passes it on
in the island's order, so when the note reaches the host every deletion sent before the
put has been done here. A put that does not fit waits for its note and is tried once
more; only then does it fail. Notes that come before their puts are remembered (the most
recent ``remember`` of them) for the puts still on their way.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any


class WaitingPuts:
    """Thread-safe: the socket thread parks puts, the executor hands over notes."""

    def __init__(self, remember: int = 65_536) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[float, Any]] = {}
        self._noted: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._remember = remember

    def park(self, handle: int, put: Any) -> bool:
        """Hold ``put``, which did not fit, until the note for ``handle``. False if that
        note came already: everything before the put is done (perhaps only since the put
        was tried), so it is tried once more now, and fails if it still does not fit."""
        with self._lock:
            if handle in self._noted:
                del self._noted[handle]
                return False
            self._waiting[handle] = (time.monotonic(), put)
            return True

    def arrived(self, handle: int) -> None:
        """A put that fit: a note that came before it is not needed."""
        with self._lock:
            self._noted.pop(handle, None)

    def noted(self, handle: int) -> Any | None:
        """The note for ``handle``: the put waiting for it, to try again, or None (the
        note is kept for a put still on its way)."""
        with self._lock:
            entry = self._waiting.pop(handle, None)
            if entry is not None:
                return entry[1]
            self._noted[handle] = None
            while len(self._noted) > self._remember:
                self._noted.popitem(last=False)
            return None

    def expired(self, seconds: float) -> list[Any]:
        """Puts held longer than ``seconds``, taken out: their note never came (the
        controller refused the put, its slice released or lost meanwhile)."""
        cutoff = time.monotonic() - seconds
        with self._lock:
            old = [h for h, (t, _) in self._waiting.items() if t < cutoff]
            return [self._waiting.pop(h)[1] for h in old]

    def __len__(self) -> int:
        return len(self._waiting)
