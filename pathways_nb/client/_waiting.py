"""``pw.wait`` and ``pw.as_completed``: arrays taken as their programs finish.

They treat RemoteArrays as ``concurrent.futures.wait`` and ``as_completed`` treat
futures (and ``dask.distributed`` and Ray theirs): several independent programs, each
on a slice of its own (a sweep, evaluations beside training), are read in the order
they finish instead of the order they were launched.

Each array's host is asked once whether it is computed, through the client's IO
thread, and answers when its program ends; an array already known to be computed is
not asked about. An array whose program failed counts as done: reading it raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from pathways_nb._core import BrokenError, ClosedError
from pathways_nb.client._remote import RemoteArray

if TYPE_CHECKING:
    from pathways_nb.client._session import Client

FIRST_COMPLETED = concurrent.futures.FIRST_COMPLETED
FIRST_EXCEPTION = concurrent.futures.FIRST_EXCEPTION
ALL_COMPLETED = concurrent.futures.ALL_COMPLETED
_WHEN = (FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED)
# Seconds a wait blocks at a time.
_SLICE = 0.1


class DoneAndNotDone(NamedTuple):
    """What :func:`wait` returns: the arrays computed (or failed), and the others, each
    in the order given (lists, not sets: arrays are not hashable, as ``jax.Array``
    is not)."""

    done: list[RemoteArray]
    not_done: list[RemoteArray]


def wait(
    arrays: Iterable[RemoteArray],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
) -> DoneAndNotDone:
    """Wait until some or all of ``arrays`` are computed, as ``concurrent.futures.wait``.

    ``return_when`` is ``"ALL_COMPLETED"`` (the default), ``"FIRST_COMPLETED"`` or
    ``"FIRST_EXCEPTION"`` (the ``concurrent.futures`` constants are these strings);
    ``timeout`` is seconds, after which it returns whatever is done by then. A failed
    program's outputs count as done and raise only when read, so one failure does not
    hide which others finished::

        runs = [train(vs, lr) for vs, lr in zip(slices, rates)]  # one slice each
        done, pending = pw.wait(runs, return_when="FIRST_COMPLETED")

    Calling it in a loop over the arrays still pending asks each host about each array
    once, not once per call. Ctrl-C (interrupt the kernel) cancels the launches of
    the arrays' clients that have not started, as while ``block_until_ready`` waits.
    """
    if return_when not in _WHEN:
        raise ValueError(
            f"return_when is one of {', '.join(map(repr, _WHEN))} (as concurrent.futures."
            f"wait takes it); got {return_when!r}"
        )
    limit = _seconds(timeout)
    xs = _arrays(arrays, "pw.wait")
    futures = [x._client._ready_future(x) for x in xs]
    deadline = None if limit is None else time.monotonic() + limit
    block(futures, [x._client for x in xs], return_when, deadline)
    flags = [f.done() for f in futures]  # once: one may finish while this reads them
    done = [x for x, d in zip(xs, flags, strict=True) if d]
    return DoneAndNotDone(done, [x for x, d in zip(xs, flags, strict=True) if not d])


def as_completed(arrays: Iterable[RemoteArray], timeout: float | None = None) -> AsCompleted:
    """The arrays, each as soon as it is computed, as ``concurrent.futures.as_completed``.

    Those already computed come first, in the order given. ``timeout`` is seconds from
    this call; past it, the iteration raises ``TimeoutError`` naming how many arrays are
    not computed. Works with ``for`` and, in a notebook cell or an asyncio program,
    with ``async for``; ``.add(x)`` takes one more array while iterating::

        for loss in pw.as_completed(losses):
            print(float(loss))  # raises the program's error if it failed
    """
    return AsCompleted(arrays, timeout)


class AsCompleted:
    """What :func:`as_completed` returns: an iterator and an async iterator over the
    arrays in the order they are computed. Every host is asked when it is made."""

    def __init__(self, arrays: Iterable[RemoteArray], timeout: float | None = None) -> None:
        limit = _seconds(timeout)
        self._timeout = timeout
        self._deadline = None if limit is None else time.monotonic() + limit
        self._arrays = _arrays(arrays, "pw.as_completed")
        self._futures = [x._client._ready_future(x) for x in self._arrays]
        self._left = len(self._arrays)
        self._finished: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Event loops' futures waiting in ``__anext__`` for the next array.
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Those known now first, in the order given; the others as their hosts answer.
        known = {i for i, f in enumerate(self._futures) if f.done()}
        for i in sorted(known):
            self._finished.put(i)
        for i, f in enumerate(self._futures):
            if i not in known:
                f.add_done_callback(functools.partial(self._on_done, i))

    def __len__(self) -> int:
        """Arrays not yet yielded."""
        return self._left

    def add(self, array: RemoteArray) -> None:
        """Take ``array`` too, as Dask's ``as_completed.add``: a loop that keeps a few
        runs going launches the next as one finishes and adds it here. An array given
        already is not taken twice."""
        (x,) = _arrays([array], "as_completed.add")
        if any(x is y for y in self._arrays):
            return
        future = x._client._ready_future(x)
        index = len(self._arrays)
        self._arrays.append(x)
        self._futures.append(future)
        self._left += 1
        future.add_done_callback(functools.partial(self._on_done, index))

    def _on_done(self, index: int, _: object = None) -> None:
        self._finished.put(index)
        with self._lock:
            wakers, self._wakers = self._wakers, []
        for loop, fut in wakers:
            with contextlib.suppress(RuntimeError):  # its loop has closed since
                loop.call_soon_threadsafe(_wake, fut)

    def _take(self, index: int) -> RemoteArray:
        self._left -= 1
        _raise_client_failure([self._futures[index]])
        return self._arrays[index]

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(
            f"{self._left} of {len(self._arrays)} arrays not computed within "
            f"{self._timeout} s (pw.as_completed's timeout)"
        )

    def __iter__(self) -> Iterator[RemoteArray]:
        return self

    def __next__(self) -> RemoteArray:
        if self._left == 0:
            raise StopIteration
        try:
            while True:
                left = _left(self._deadline)
                try:
                    # In slices, so that an interrupt the kernel raises between them gets in.
                    index = self._finished.get(timeout=_slice(left))
                    break
                except queue.Empty:
                    if left is not None and left <= _SLICE:
                        raise self._timed_out() from None
        except KeyboardInterrupt:
            _cancel(x._client for x in self._arrays)
            raise
        return self._take(index)

    def __aiter__(self) -> AsCompleted:
        return self

    async def __anext__(self) -> RemoteArray:
        if self._left == 0:
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        while True:
            try:
                return self._take(self._finished.get_nowait())
            except queue.Empty:
                pass
            woken: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._wakers.append((loop, woken))
            if not self._finished.empty():
                continue  # one finished before the waker was in place
            try:
                await asyncio.wait_for(woken, _left(self._deadline))
            except TimeoutError:
                raise self._timed_out() from None


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _arrays(arrays: Any, what: str) -> list[RemoteArray]:
    """``arrays`` as a list of RemoteArrays, each once, in the order given."""
    from pathways_nb.client._remote import RemoteArray

    if isinstance(arrays, RemoteArray):
        raise TypeError(f"{what} takes a list of RemoteArrays; wrap one array as [x]")
    try:
        items = list(arrays)
    except TypeError:
        raise TypeError(
            f"{what} takes a list (any iterable) of RemoteArrays; got "
            f"{type(arrays).__name__}. For a pytree of them, pass jax.tree.leaves(tree)"
        ) from None
    out: list[RemoteArray] = []
    seen: set[int] = set()
    for i, x in enumerate(items):
        if not isinstance(x, RemoteArray):
            raise TypeError(
                f"{what} takes RemoteArrays (what pw.jit functions and vs.put return); "
                f"item {i} is a {type(x).__name__}"
            )
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def block(
    futures: list[concurrent.futures.Future[Any]],
    clients: Iterable[Client],
    return_when: str = ALL_COMPLETED,
    deadline: float | None = None,
) -> None:
    """Wait for ``futures`` (answers of the clients' hosts) as ``concurrent.futures.wait``
    does, until ``deadline`` (``time.monotonic()``) if given. Ctrl-C cancels the clients'
    queued launches, as while a fetch waits; a client that closed or broke meanwhile
    raises."""
    try:
        while not _met(futures, return_when):
            left = _left(deadline)
            if left == 0:
                break
            # In slices, so that an interrupt the kernel raises between them gets in.
            concurrent.futures.wait(futures, _slice(left), return_when)
    except KeyboardInterrupt:
        _cancel(clients)
        raise
    _raise_client_failure(futures)


def _met(futures: list[concurrent.futures.Future[Any]], return_when: str) -> bool:
    done = [f for f in futures if f.done()]
    if len(done) == len(futures):
        return True
    if return_when == FIRST_COMPLETED:
        return bool(done)
    if return_when == FIRST_EXCEPTION:
        return any(f.exception() is not None for f in done)
    return False


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _slice(left: float | None) -> float:
    return _SLICE if left is None else min(_SLICE, left)


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise ValueError(f"timeout is seconds, >= 0, or None to wait for ever; got {timeout!r}")
    return float(timeout)


def _raise_client_failure(futures: Iterable[concurrent.futures.Future[Any]]) -> None:
    """A client that closed or broke while waiting says so: that is no array's outcome."""
    for f in futures:
        if f.done():
            exc = f.exception()
            if isinstance(exc, ClosedError | BrokenError):
                raise exc


def _cancel(clients: Iterable[Client]) -> None:
    for client in {id(c): c for c in clients}.values():
        client.cancel()


def fetch(tree: Any) -> Any:
    """``pw.fetch({"y": y})``: the values of every RemoteArray in a pytree."""
    leaves = _remote_leaves(tree)
    return leaves[0]._client.fetch(tree) if leaves else tree


def block_until_ready(tree: Any) -> Any:
    """``pw.block_until_ready(state)``: wait until every RemoteArray in a pytree is
    computed, with one request per host; returns ``tree`` (see
    :meth:`Client.block_until_ready`)."""
    leaves = _remote_leaves(tree)
    return leaves[0]._client.block_until_ready(tree) if leaves else tree


def _remote_leaves(tree: Any) -> list[RemoteArray]:
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: type(x) is RemoteArray)
    return [x for x in leaves if type(x) is RemoteArray]
