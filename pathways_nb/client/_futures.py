"""Futures that work both with ``.result()`` and with ``await``."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")


class Future(concurrent.futures.Future[T]):
    """A thread-safe future; ``await fut`` works in a running event loop (a notebook cell)."""

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self).__await__()
