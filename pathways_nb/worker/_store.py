"""The object store: handle → array | error, with memory accounting and waiters.

A handle is *absent* until the dispatch thread stores the program's outputs (JAX arrays
whose computation may still be running: JAX's own async dispatch orders the rest) or an
error; it is *ready* once the completion thread saw its computation finish. Fetches
that arrive earlier park a callback instead of blocking a thread.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pathways_nb._core import RemoteError, ResourceExhaustedError, handle_owner


@dataclasses.dataclass
class Entry:
    value: Any = None
    error: RemoteError | None = None
    nbytes: int = 0
    # (program, slice) that made it, so late failures name their origin.
    origin: tuple[str, str] = ("", "")
    # True once its computation finished (the completion thread says so).
    ready: bool = False


Waiter = Callable[[Entry], None]


@dataclasses.dataclass(frozen=True)
class StoreStatistics:
    arrays: int
    errors: int
    bytes: int
    limit: int
    waiters: int
    # Bytes one tenant's arrays may take here (0: no quota), and the most any takes.
    tenant_limit: int = 0
    tenant_max_bytes: int = 0


class ObjectStore:
    """Thread-safe; ``limit`` bytes (0 = none) bounds the resident arrays, and
    ``tenant_limit`` (0 = none) those of each tenant (the owner of their handles)."""

    def __init__(self, limit: int = 0, tenant_limit: int = 0) -> None:
        self.limit = limit
        self.tenant_limit = tenant_limit
        self._entries: dict[int, Entry] = {}
        self._ready_waiters: dict[int, list[Waiter]] = {}
        self._bytes = 0
        # tenant -> bytes of its arrays held here
        self._owned: dict[int, int] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._cond_waiters = 0  # threads in wait(): only they need notify_all
        # Absent handles parked work waits for; on_arrival() runs when one is stored.
        self._watched: set[int] = set()
        self.on_arrival: Callable[[], None] | None = None

    def reserve_check(self, nbytes: int, freeing: int = 0, tenant: int | None = None) -> None:
        """Raise ResourceExhaustedError if ``nbytes`` more, of ``tenant``'s, would pass
        the store's limit or the tenant's (``freeing``: bytes the same step lets go of)."""
        if self.limit and self._bytes - freeing + nbytes > self.limit:
            raise ResourceExhaustedError(
                f"the object store would hold {self._bytes - freeing + nbytes} bytes, over its "
                f"limit of {self.limit} (now {self._bytes} resident). Delete arrays you no longer "
                "need (`del x` or `x.delete()`) or raise PATHWAYS_STORE_LIMIT_BYTES"
            )
        if self.tenant_limit and tenant is not None:
            mine = self._owned.get(tenant, 0)
            if mine - freeing + nbytes > self.tenant_limit:
                raise ResourceExhaustedError(
                    f"this client's arrays on this host would take {mine - freeing + nbytes} "
                    f"bytes, over the {self.tenant_limit} bytes one client may keep on a host "
                    f"(now {mine}; PATHWAYS_TENANT_STORE_BYTES, set where the controller "
                    "runs). Delete arrays you no longer need (`del x` or `x.delete()`), or "
                    "ask the cluster's operator to raise the quota"
                )

    def _account(self, handle: int, delta: int) -> None:
        """Add ``delta`` bytes to the handle's owner; the caller holds the lock."""
        if delta:
            owner = handle_owner(handle)
            left = self._owned.get(owner, 0) + delta
            if left:
                self._owned[owner] = left
            else:
                del self._owned[owner]

    def tenant_bytes(self) -> list[list[int]]:
        """``[[tenant, bytes], ...]`` of the tenants with arrays here."""
        with self._lock:
            return [[t, n] for t, n in self._owned.items()]

    def set(
        self,
        handle: int,
        value: Any,
        nbytes: int,
        origin: tuple[str, str] = ("", ""),
        ready: bool = False,
    ) -> None:
        self._set(handle, Entry(value=value, nbytes=nbytes, origin=origin, ready=ready))

    def fail(self, handle: int, error: RemoteError) -> None:
        self._set(handle, Entry(error=error, ready=True))

    def mark_ready(self, handles: Iterable[int]) -> None:
        """The computations behind ``handles`` finished: answer who waits for them."""
        calls = []
        with self._lock:
            for h in handles:
                entry = self._entries.get(h)
                if entry is None:
                    continue
                entry.ready = True
                for w in self._ready_waiters.pop(h, ()):
                    calls.append((w, entry))
        for w, entry in calls:
            w(entry)

    def has_ready_waiters(self, handles: Iterable[int]) -> bool:
        """Whether anyone waits for one of ``handles`` to be computed."""
        waiting = self._ready_waiters
        return any(h in waiting for h in handles)

    def when_ready(self, handle: int, waiter: Waiter) -> None:
        """Call ``waiter(entry)`` once the handle's value is computed or has failed."""
        with self._lock:
            entry = self._entries.get(handle)
            if entry is None or not entry.ready:
                self._ready_waiters.setdefault(handle, []).append(waiter)
                return
        waiter(entry)

    def _set(self, handle: int, entry: Entry) -> None:
        with self._lock:
            old = self._entries.get(handle)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[handle] = entry
            self._bytes += entry.nbytes
            self._account(handle, entry.nbytes - (old.nbytes if old is not None else 0))
            waiters = self._ready_waiters.pop(handle, []) if entry.ready else []
            if self._cond_waiters:
                self._cond.notify_all()
            arrived = handle in self._watched
            if arrived:
                self._watched.discard(handle)
        for w in waiters:
            w(entry)
        if arrived and self.on_arrival is not None:
            self.on_arrival()

    def wait(self, handle: int, timeout: float) -> Entry | None:
        """Block until the handle is present; None on timeout."""
        with self._cond:
            self._cond_waiters += 1
            try:
                ok = self._cond.wait_for(lambda: handle in self._entries, timeout)
            finally:
                self._cond_waiters -= 1
            return self._entries[handle] if ok else None

    def set_many(
        self,
        handles: Sequence[int],
        values: Sequence[Any],
        nbytes: Sequence[int],
        origin: tuple[str, str],
    ) -> None:
        """Store a launch's outputs, not yet computed, under one lock."""
        if len(handles) != len(values):
            raise ValueError(f"{len(handles)} handles for {len(values)} outputs")
        entries = self._entries
        account = self._account
        with self._lock:
            for h, v, n in zip(handles, values, nbytes, strict=True):
                old = entries.get(h)
                delta = n if old is None else n - old.nbytes
                entries[h] = Entry(v, None, n, origin, False)
                self._bytes += delta
                account(h, delta)
            if self._cond_waiters:
                self._cond.notify_all()
            arrived = bool(self._watched) and not self._watched.isdisjoint(handles)
            if arrived:
                self._watched.difference_update(handles)
        if arrived and self.on_arrival is not None:
            self.on_arrival()

    def get_many(self, handles: Iterable[int], computed: bool = False) -> list[Entry] | None:
        """The entries of ``handles``, or None if one is absent or, with ``computed``,
        not yet computed (a failed one counts as done)."""
        out = []
        with self._lock:
            get = self._entries.get
            for h in handles:
                e = get(h)
                if e is None or (computed and not e.ready):
                    return None
                out.append(e)
        return out

    def watch_absent(self, handles: Iterable[int]) -> list[int]:
        """Those of ``handles`` not stored yet, watched so ``on_arrival`` runs when one is."""
        with self._lock:
            missing = [h for h in handles if h not in self._entries]
            self._watched.update(missing)
        return missing

    def unwatch(self, handles: Iterable[int]) -> None:
        with self._lock:
            self._watched.difference_update(handles)

    def get(self, handle: int) -> Entry | None:
        with self._lock:
            return self._entries.get(handle)

    def drop(self, handles: Iterable[int]) -> int:
        # The arrays are freed once the lock is let go: freeing a JAX array lets go of
        # the GIL, and a thread waiting for this lock meanwhile would wait for both.
        dropped = []
        orphans: list[tuple[int, list[Waiter]]] = []
        with self._lock:
            for h in handles:
                entry = self._entries.pop(h, None)
                if entry is not None:
                    self._bytes -= entry.nbytes
                    self._account(h, -entry.nbytes)
                    dropped.append(entry)
                if self._ready_waiters:
                    waiters = self._ready_waiters.pop(h, None)
                    if waiters:
                        orphans.append((h, waiters))
        # A fetch or wait that came before the deletion (from another of the owner's
        # threads) is answered now: nothing will ever store that handle again.
        for h, waiters in orphans:
            gone = Entry(error=RemoteError(f"array {h:#x} was deleted", kind="invalid"), ready=True)
            for w in waiters:
                w(gone)
        return len(dropped)

    def fail_waiters(self, make_error: Callable[[int], RemoteError]) -> None:
        """Answer every parked waiter with an error (the host is shutting down)."""
        with self._lock:
            waiters, self._ready_waiters = self._ready_waiters, {}
        for h, ws in waiters.items():
            for w in ws:
                w(Entry(error=make_error(h), ready=True))

    @property
    def bytes(self) -> int:
        return self._bytes

    def statistics(self) -> StoreStatistics:
        with self._lock:
            return StoreStatistics(
                arrays=sum(1 for e in self._entries.values() if e.error is None),
                errors=sum(1 for e in self._entries.values() if e.error is not None),
                bytes=self._bytes,
                limit=self.limit,
                waiters=sum(len(w) for w in self._ready_waiters.values()),
                tenant_limit=self.tenant_limit,
                tenant_max_bytes=max(self._owned.values(), default=0),
            )
