"""A host's answers to a client's ``fetch`` and ``wait``, of one array or of many.

A client that fetches or waits for several arrays on one host asks for them in one
``fetch_many``/``wait_many`` message and gets one answer, instead of a message and an
answer each: for a pytree of a thousand small leaves the messages, not the bytes, were
most of the cost. The answer goes once every array is computed, or at the first that
failed, as a ``failed`` naming its index.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pathways_nb._core import as_bytes, encode_dtype
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._hostcopy import to_numpy
from pathways_nb.worker._store import Entry, ObjectStore

# Arrays this large (in all) are copied out on the fetch pool, so that no loop stalls on
# a copy; smaller ones are answered by whichever thread learns they are ready.
INLINE_BYTES = 1 << 20
# Handles one fetch_many or wait_many may name (clients split larger requests): it keeps
# an answer's frame count within what every transport carries.
MAX_HANDLES = 512

ToClient = Callable[[bytes, dict[str, Any], Sequence[Any]], None]


def host_payload(value: Any) -> tuple[dict[str, Any], np.ndarray]:
    """The fields describing ``value`` in an answer, and its bytes as a NumPy array."""
    fields: dict[str, Any] = {}
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        fields["key_impl"] = str(jax.random.key_impl(value))
        value = jax.random.key_data(value)
    arr = to_numpy(value)
    fields["shape"] = list(arr.shape)
    fields["dtype"] = encode_dtype(arr.dtype)
    return fields, arr


class _Gathering:
    """The entries of one many-request, filled in as each becomes ready."""

    def __init__(
        self,
        n: int,
        on_all: Callable[[list[Entry]], None],
        on_error: Callable[[int, Entry], None],
    ) -> None:
        self._entries: list[Entry | None] = [None] * n
        self._left = n
        self._over = False
        self._lock = threading.Lock()
        self._on_all = on_all
        self._on_error = on_error

    def waiter(self, index: int) -> Callable[[Entry], None]:
        def ready(entry: Entry) -> None:
            with self._lock:
                if self._over:
                    return  # answered already, at an earlier failure
                failed = entry.error is not None
                self._entries[index] = entry
                self._left -= 1
                self._over = failed or self._left == 0
                finished = self._over
            if failed:
                self._on_error(index, entry)
            elif finished:
                self._on_all([e for e in self._entries if e is not None])

        return ready


class Answers:
    """Answers fetches and waits from the store's entries, on the thread that learns
    they are ready or, for big arrays, on ``pool``."""

    def __init__(
        self,
        host: str,
        store: ObjectStore,
        to_client: ToClient,
        pool: concurrent.futures.Executor,
    ) -> None:
        self.host = host
        self._store = store
        self._to_client = to_client
        self._pool = pool

    def one(self, identity: bytes, rid: int, kind: str, handle: int) -> None:
        """Answer a ``fetch`` or ``wait`` of one array once it is computed."""

        self._store.when_ready(handle, lambda entry: self._send(identity, rid, kind, [entry]))

    def many(self, identity: bytes, rid: int, kind: str, handles: list[Any]) -> None:
        """Answer a ``fetch_many`` or ``wait_many`` once all its arrays are computed."""
        if not 0 < len(handles) <= MAX_HANDLES or any(type(h) is not int for h in handles):
            self._to_client(
                identity,
                {
                    "t": "error",
                    "rid": rid,
                    "message": f"{kind} takes a list of 1 to {MAX_HANDLES} integer handles; "
                    f"got {len(handles)} items"
                    + ("" if all(type(h) is int for h in handles) else ", not all integers")
                    + ". Split larger requests.",
                },
                (),
            )
            return

        def all_ready(entries: list[Entry]) -> None:
            self._send(identity, rid, kind, entries)

        def failed(index: int, entry: Entry) -> None:
            assert entry.error is not None
            self._fail(identity, rid, kind, index, entry.error.to_dict())

        # All computed already (the common case): answered now, without a waiter each
        # (_answer names the first that failed).
        done = self._store.get_many(handles, computed=True)
        if done is not None:
            all_ready(done)
            return
        gathering = _Gathering(len(handles), all_ready, failed)
        for i, handle in enumerate(handles):
            self._store.when_ready(handle, gathering.waiter(i))

    def _send(self, identity: bytes, rid: int, kind: str, entries: list[Entry]) -> None:
        """Answer now, on this thread, unless the answer copies many bytes: then on the
        pool."""
        small = sum(e.nbytes for e in entries) <= INLINE_BYTES
        if small or kind.startswith("wait") or any(e.error is not None for e in entries):
            self._answer(identity, rid, kind, entries)
        else:
            self._pool.submit(self._answer, identity, rid, kind, entries)

    def _answer(self, identity: bytes, rid: int, kind: str, entries: list[Entry]) -> None:
        """Send the arrays of ``entries`` (or, for a wait, that they are computed), or
        the error of the first that has one."""
        for i, entry in enumerate(entries):
            if entry.error is not None:
                self._fail(identity, rid, kind, i, entry.error.to_dict())
                return
        waiting = kind in ("wait", "wait_many")
        done: list[tuple[dict[str, Any], np.ndarray]] = []
        index = 0  # of the entry being read: the one named if reading fails
        try:
            if waiting:
                try:
                    # One call into JAX, one release of the GIL, however many there are.
                    jax.block_until_ready([e.value for e in entries])
                except Exception:
                    # Which one failed: each on its own (if none does alone, the last).
                    for index in range(len(entries)):
                        jax.block_until_ready(entries[index].value)
                    raise
            else:
                for index in range(len(entries)):
                    done.append(host_payload(entries[index].value))
        except Exception as exc:
            program, sname = entries[index].origin
            err = to_remote(exc, "runtime", program=program, slice=sname, host=self.host)
            self._fail(identity, rid, kind, index, err.to_dict())
            return
        if waiting:
            self._to_client(identity, {"t": "reply", "rid": rid}, ())
        elif kind == "fetch":
            fields, arr = done[0]
            self._to_client(identity, {"t": "array", "rid": rid, **fields}, [as_bytes(arr)])
        else:
            header = {
                "t": "arrays",
                "rid": rid,
                "shapes": [f["shape"] for f, _ in done],
                "dtypes": [f["dtype"] for f, _ in done],
                "key_impls": [f.get("key_impl", "") for f, _ in done],
            }
            self._to_client(identity, header, [as_bytes(a) for _, a in done])

    def _fail(
        self, identity: bytes, rid: int, kind: str, index: int, error: dict[str, Any]
    ) -> None:
        header: dict[str, Any] = {"t": "failed", "rid": rid, "error": error}
        if kind.endswith("_many"):
            header["index"] = index
        self._to_client(identity, header, ())
