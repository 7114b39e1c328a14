"""A session's host buffers: the bytes of arrays on their way in or out.

The JAX client streams an array's bytes (``HostBufferStore``) beside the request that
uses them, and that request often arrives first; it waits here for them. Bytes of an
array copied out wait here for the client to look them up: a copy is answered at once,
and the client's lookup, which follows, waits here for its bytes (or its error), which
saves the client one round trip per read.
"""

from __future__ import annotations

import threading
import time


class HostBuffers:
    """Thread-safe: gRPC's threads store and look up, the session's thread takes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buffers: dict[int, bytes] = {}
        # Handles of copies out still under way, and those that failed, with why.
        self._pending: set[int] = set()
        self._errors: dict[int, BaseException] = {}
        self._closed = False

    def put(self, handle: int, data: bytes) -> None:
        with self._cond:
            if self._closed:
                return
            self._buffers[handle] = data
            self._pending.discard(handle)
            self._cond.notify_all()

    def expect(self, handle: int) -> None:
        """Bytes for ``handle`` are on their way out: a lookup waits for them."""
        with self._cond:
            self._pending.add(handle)

    def fail(self, handle: int, exc: BaseException) -> None:
        """The copy out for ``handle`` failed: its lookup raises ``exc``."""
        with self._cond:
            if self._closed:
                return
            self._pending.discard(handle)
            self._errors[handle] = exc
            self._cond.notify_all()

    def take(self, handle: int, timeout: float) -> bytes:
        """The bytes stored under ``handle``, removed; waits up to ``timeout`` seconds
        for them. Raises TimeoutError, or LookupError once the session ended."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while handle not in self._buffers:
                if self._closed:
                    raise LookupError(f"host buffer {handle}: the session has ended")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"host buffer {handle} did not arrive within {timeout:g} s of the "
                        "request that uses it"
                    )
                self._cond.wait(left)
            return self._buffers.pop(handle)

    def get(self, handle: int, timeout: float = 0.0) -> bytes | None:
        """The bytes stored under ``handle`` (None if there are none); waits up to
        ``timeout`` seconds for those of a copy under way, and raises its error if it
        failed (TimeoutError if it takes longer, LookupError once the session ended)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while handle in self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"host buffer {handle} was not copied out within {timeout:g} s"
                    )
                self._cond.wait(left)
            if handle in self._errors:
                raise self._errors.pop(handle)
            if self._closed:
                raise LookupError(f"host buffer {handle}: the session has ended")
            return self._buffers.get(handle)

    def delete(self, handle: int) -> bool:
        with self._cond:
            self._pending.discard(handle)
            gone = self._errors.pop(handle, None) is not None
            return self._buffers.pop(handle, None) is not None or gone

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._buffers.clear()
            self._pending.clear()
            self._errors.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._buffers)
