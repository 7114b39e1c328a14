"""Arrays a Dask task on this host's own worker process is computing for the store.

A client puts a Dask collection on a slice by naming a handle and asking the Dask
worker that runs the slice's host to compute it there; the result goes into the object
store in that process, with no network hop. The client says ``expect`` first, so that
launches reading the handle wait for it as long as its task may take (not the
``put_wait_seconds`` a put of bytes in flight gets), and a drop of the handle that comes
before the value means the value, when it comes, is let go instead of kept. The task and
the client's ``expect`` race (one goes through the Dask scheduler, the other straight to
this host), so a value may also come first; its ``expect`` is then a no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class FedPuts:
    """Thread-safe: the socket thread expects, the dispatch thread drops and asks, the
    Dask task's thread stores."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._awaited: set[int] = set()
        self._dropped: set[int] = set()
        # Values that came before their expect.
        self._early: set[int] = set()

    def expect(self, handle: int) -> None:
        with self._lock:
            if handle in self._early:
                self._early.discard(handle)
            else:
                self._awaited.add(handle)

    def all_awaited(self, handles: Iterable[int]) -> bool:
        """Whether every one of ``handles`` is still being computed by a Dask task."""
        with self._lock:
            return bool(self._awaited) and self._awaited.issuperset(handles)

    def outstanding(self, handle: int) -> bool:
        """Whether ``handle`` was expected and its value has not come (dropped or not)."""
        with self._lock:
            return handle in self._awaited or handle in self._dropped

    def drop(self, handles: Iterable[int]) -> None:
        """The client let go of these handles: values still to come are not kept."""
        with self._lock:
            if self._awaited or self._early:
                handles = set(handles)
                gone = self._awaited & handles
                self._awaited -= gone
                self._dropped |= gone
                self._early -= handles

    def arrive(self, handle: int) -> bool:
        """The value (or error) for ``handle`` is here: whether to store it."""
        with self._lock:
            if handle in self._awaited:
                self._awaited.discard(handle)
            elif handle in self._dropped:
                self._dropped.discard(handle)
                return False
            else:
                self._early.add(handle)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._awaited)
