"""A session's host buffers: the bytes of arrays on their way in or out.

The JAX client streams an array's bytes (``HostBufferStore``) beside the request that
uses them, and that request often arrives first; it waits here for them. Bytes of an
array copied out wait here for the client to look them up.
"""

from __future__ import annotations

import threading
import time


class HostBuffers:
    """Thread-safe: gRPC's threads store and look up, the session's thread takes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buffers: dict[int, bytes] = {}
        self._closed = False

    def put(self, handle: int, data: bytes) -> None:
        with self._cond:
            if self._closed:
                return
            self._buffers[handle] = data
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

    def get(self, handle: int) -> bytes | None:
        with self._cond:
            return self._buffers.get(handle)

    def delete(self, handle: int) -> bool:
        with self._cond:
            return self._buffers.pop(handle, None) is not None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._buffers.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._buffers)
