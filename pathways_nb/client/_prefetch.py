"""``RemoteArray.copy_to_host_async``: values fetched in the background, read later.

A training loop that logs a metric each step asks for it early and reads it once the
step after has been submitted, as with a ``jax.Array``; the round trip to the host then
overlaps the next step's submission instead of holding the loop. One thread, started at
the first request and stopped (pending requests cancelled) when the client closes.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from pathways_nb._core import ClosedError


class Prefetcher:
    """Runs ``fetch`` calls on a thread of its own; :meth:`stop` is safe to call twice."""

    def __init__(self, fetch: Callable[[Any], Any]) -> None:
        self._fetch = fetch
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def submit(self, x: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._stopped:
                raise ClosedError("this client was closed; create a new pw.Client")
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="pathways-prefetch"
                )
            return self._pool.submit(self._fetch, x)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
