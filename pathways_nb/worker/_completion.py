"""A host's completions: launches in XLA's hands, waited for in order and acknowledged
in batches on the completion thread, or at once where XLA finished them inline.

The executor hands every launch it dispatched (or failed before dispatching) here, and
waits for room before giving XLA more than the window allows. A dispatched launch does
not wake the completion thread by itself: the threads that dispatch call :meth:`reap`
before they wait for more work, which records the launches XLA has already finished
and wakes the completion thread once for the rest, instead of once for each launch
(every sleep and wake of a thread costs tens of microseconds of CPU on a busy machine,
as much as the Python around a launch). A launch someone waits for, a full window and a
launch left unannounced for ``_ACK_DELAY`` wake it at once. Shutdown: :meth:`stop`
queues a sentinel behind every launch; :meth:`loop` returns once it reaches it.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from pathways_nb._core import RemoteError
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._store import ObjectStore

STOP = object()
# Launches expected to finish within this many seconds together share one wait.
_BATCH_WAIT = 2e-3
# How long a finished launch's acknowledgement may wait for company: bounds how stale
# the controller's accounting, the event log and the client's is_ready() can be.
_ACK_DELAY = 2e-3
# A launch running alone that someone waits on (a fetch, block_until_ready) and that has
# measured at most this long is waited for by the thread that dispatched it.
_INLINE_WAIT = 2e-3


class Done(NamedTuple):
    """A dispatched launch, handed to the completion thread."""

    lid: int
    outs: list[int]
    leaves: list[Any] | None  # None when it failed before running
    t0: float
    err: RemoteError | None
    name: str
    sname: str
    donated: list[Any]
    # Bytes of the machine's memory held for its outputs until it finishes (see _guards).
    reserved: int = 0


class Completions:
    """Waits for dispatched launches, marks their outputs ready, acknowledges them."""

    def __init__(
        self,
        host: str,
        store: ObjectStore,
        send: Callable[[dict[str, Any]], None],
        window: int,
    ) -> None:
        self.host = host
        self.store = store
        self._send = send
        # With the window nearly full, acknowledgements go out once this host is down to
        # half a window in flight, so the controller refills it before the devices run dry.
        self.window = window
        self._ack_low_water = max(1, window // 2)
        self.received = 0  # launches the host received; the executor counts them
        self.completed = 0
        self.failures = 0  # launches that failed while XLA ran them
        # Launches handed to XLA and not yet seen complete. The controller's window bounds
        # this, except for launches it no longer counts because they were parked: when
        # those resume, the dispatch thread keeps XLA's queue within the window.
        self._in_xla = 0
        self._room = threading.Condition()
        # Measured seconds per program name (moving average): which launches are short.
        self._duration: dict[str, float] = {}
        self._prev_end = 0.0
        # Held while completions are recorded (_complete and the counters it feeds): by
        # the completion thread, or by a thread recording a launch that finished at once.
        self._finishing = threading.Lock()
        # ids of arrays a dispatched launch donates. XLA may free such a buffer before
        # JAX marks the array deleted, so waiting on it must not read as a failure of the
        # launch that made it.
        self.donated: set[int] = set()
        # Launches handed over and not yet taken by the completion thread. Appending to
        # a deque wakes nobody; _wake does, and _unseen_since says since when launches
        # have been waiting unannounced (0.0: none).
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._unseen_since = 0.0
        # Whether the completion thread holds no launch of its own (it waits for work,
        # or has not started): only then may a dispatcher record launches itself (see
        # reap), so each launch's start follows the end of the one before it.
        self._idle = True
        # Called with the outputs of launches just finished or failed, once who waits
        # for them has been answered (the host's sender: sends waiting for them go now).
        self.on_computed: Callable[[list[int]], None] | None = None
        # Called with a finished launch's reserved bytes (the memory guard's release).
        self.on_released: Callable[[int], None] | None = None

    def wait_for_room(self) -> None:
        """Block until XLA holds fewer launches than the window."""
        if self._in_xla >= self.window:
            self.kick()
        with self._room:
            while self._in_xla >= self.window:
                self._room.wait(0.1)

    def has_room(self) -> bool:
        """Whether XLA holds fewer launches than the window (a hint: room only grows
        meanwhile, as other threads see launches finish)."""
        return self._in_xla < self.window

    def failed(self, item: Done) -> None:
        """A launch that failed before XLA ran it: acknowledged in order with the rest."""
        self._queue.append(item)
        self._wake.set()

    def stop(self) -> None:
        self._queue.append(STOP)
        self._wake.set()

    def kick(self) -> None:
        """Wake the completion thread for the launches dispatched since it last looked."""
        if self._unseen_since:
            self._unseen_since = 0.0
            self._wake.set()

    def reap(self) -> None:
        """Called by a dispatching thread before it waits for more work: record here and
        now the queued launches XLA has finished, oldest first, while the completion
        thread has nothing of its own in hand; wake it for the rest.

        The launches a host dispatches while XLA runs the ones before them are mostly
        done by the time the dispatcher looks up: they need no thread woken at all.
        """
        if not self._queue:
            return
        if self._idle and self._finishing.acquire(blocking=False):
            acks: list[Any] = []
            computed: list[int] = []
            finished: list[int] = []
            try:
                while self._queue:
                    item = self._queue[0]
                    if item is STOP or not _finished(item.leaves):
                        break
                    self._queue.popleft()
                    acks.append(self._complete(item, computed))
                    finished.extend(item.outs)
                    self.completed += 1
            finally:
                self._finishing.release()
            if acks:
                self._tell(computed, finished, acks)
        self._unseen_since = 0.0
        if self._queue:
            self._wake.set()

    def _hand_over(self, item: Done) -> None:
        """Queue a dispatched launch; wake the completion thread only if it must look now:
        someone waits for the launch, the window is full (the dispatcher is about to wait
        for room), or launches have waited unannounced for ``_ACK_DELAY``."""
        self._queue.append(item)
        now = time.monotonic()
        if (
            self._in_xla >= self.window
            or self.store.has_ready_waiters(item.outs)
            or (self._unseen_since and now - self._unseen_since >= _ACK_DELAY)
        ):
            self._unseen_since = 0.0
            self._wake.set()
        elif not self._unseen_since:
            self._unseen_since = now

    def dispatched(self, item: Done) -> None:
        """A launch is in XLA's hands; its completion is recorded by the completion thread,
        or here and now when it runs alone and either XLA already finished it or it is
        short and someone waits on it.

        Small programs without collectives run inline in XLA:CPU's execute call; a short
        one that a fetch already waits for (a one-at-a-time loop) is waited for here, the
        dispatching thread holding still for at most ~``_INLINE_WAIT``. Either way the
        waiting fetch is answered and the launch acknowledged without two thread
        hand-offs (to the completion thread, then to the socket thread).
        """
        with self._room:
            alone = self._in_xla == 0
            self._in_xla += 1
        if alone and self._finishing.acquire(blocking=False):
            ack = None
            computed: list[int] = []
            try:
                short = self._duration.get(item.name, _INLINE_WAIT + 1) <= _INLINE_WAIT
                if not self._queue and (
                    (short and self.store.has_ready_waiters(item.outs))
                    or all(_is_ready(leaf) for leaf in item.leaves or ())
                ):
                    ack = self._complete(item, computed)
                    self.completed += 1
            finally:
                self._finishing.release()
            if ack is not None:
                self._tell(computed, item.outs, [ack])
                return
        self._hand_over(item)

    def _tell(self, computed: list[int], finished: list[int], acks: list[Any]) -> None:
        """Answer who waits for launches a dispatcher just recorded, let the arrays other
        hosts wait for leave, then acknowledge the launches."""
        self.store.mark_ready(computed)
        if self.on_computed is not None:
            self.on_computed(finished)
        self._send({"t": "acks", "items": acks})

    def loop(self) -> None:
        acks: list[Any] = []
        oldest = 0.0  # when the oldest unsent acknowledgement was made
        queued: collections.deque[Any] = collections.deque()

        def flush() -> None:
            nonlocal acks
            if acks:
                self._send({"t": "acks", "items": acks})
                acks = []

        while True:
            if not queued and not self._queue:
                # Launches in XLA that nobody announced are looked at after _ACK_DELAY
                # even if no dispatcher reaps (one busy with a long message, say).
                if acks:
                    wait: float | None = max(0.0, oldest + _ACK_DELAY - time.monotonic())
                else:
                    wait = _ACK_DELAY if self._in_xla else None
                self._idle = True
                woke = self._wake.wait(wait)
                self._idle = False
                self._wake.clear()
                if not self._queue:
                    if not woke:
                        flush()  # nothing else finished in time: do not sit on them
                    continue
            # Under _finishing, so a dispatcher's reap never races this for the head.
            with self._finishing:
                while self._queue:
                    queued.append(self._queue.popleft())
            if not queued:
                continue  # a dispatcher recorded them meanwhile
            count, expected = self._plan_wait(queued)
            if acks and expected >= _ACK_DELAY:
                flush()  # about to wait long: send what is done first
            self._wait_for(queued, count)
            computed: list[int] = []
            finished: list[int] = []
            stop = False
            with self._finishing:
                for _ in range(count):
                    item = queued.popleft()
                    if item is STOP:
                        stop = True
                        break
                    if not acks:
                        oldest = time.monotonic()
                    acks.append(self._complete(item, computed))
                    finished.extend(item.outs)
                    self.completed += 1
            # One pass over the store for the whole group answers its waiting fetches;
            # the arrays other hosts wait for leave before the acknowledgements.
            self.store.mark_ready(computed)
            if self.on_computed is not None and finished:
                self.on_computed(finished)
            if stop:
                flush()
                return
            # The controller needs acknowledgements only to refill the window and to
            # account; launches that finished together go together, and they wait for
            # company while more of this host's launches are about to finish.
            inflight = self.received - self.completed
            if (
                inflight == 0
                or len(acks) >= 256
                or time.monotonic() - oldest >= _ACK_DELAY
                or (inflight + len(acks) >= self.window and inflight <= self._ack_low_water)
            ):
                flush()

    def _plan_wait(self, queued: collections.deque[Any]) -> tuple[int, float]:
        """How many queued items to complete after one wait, and its expected seconds.

        Short launches share one sleep: a run of queued launches expected to take under
        _BATCH_WAIT together, ending early at one someone waits on (fetch,
        block_until_ready). Launches on the same devices finish in order, so the ones
        before the last are then done and their own waits return at once; on other
        devices they wait. Long launches are waited for one by one, so nobody's answer
        is held behind someone else's long program.
        """
        count, expected = 0, 0.0
        for i, item in enumerate(queued):
            if item is STOP:
                return i + 1, expected
            cost = self._duration.get(item.name, _BATCH_WAIT)
            if i and expected + cost > _BATCH_WAIT:
                break
            expected += cost
            count = i + 1
            if self.store.has_ready_waiters(item.outs):
                break
        return count, expected

    def _wait_for(self, queued: collections.deque[Any], count: int) -> None:
        """Wait for the last launch among the first ``count`` queued items."""
        for i in range(count - 1, -1, -1):
            item = queued[i]
            if item is not STOP and item.leaves is not None:
                with contextlib.suppress(Exception):  # its own completion records a failure
                    _wait_outputs(item.leaves, self.donated)
                return

    def _complete(self, item: Done, computed: list[int]) -> list[Any]:
        """Wait for one launch; record its outputs as failed or add them to ``computed``;
        return its acknowledgement."""
        lid, outs, leaves, t0, err, name, sname, donated, reserved = item
        if reserved and self.on_released is not None:
            self.on_released(reserved)
        if leaves is not None:
            with self._room:
                self._in_xla -= 1
                self._room.notify()
        if err is None:
            try:
                _wait_outputs(leaves or [], self.donated)
            except Exception as exc:
                err = to_remote(exc, "runtime", program=name, slice=sname, host=self.host)
                for hd in outs:
                    self.store.fail(hd, err)
                self.failures += 1
        if err is None:
            computed.extend(outs)
        # This launch ran, so the arrays it donated are gone for good: stop tracking them.
        if donated:
            self.donated.difference_update(id(a) for a in donated)
        t1 = time.time()
        start = max(t0, self._prev_end)
        self._prev_end = t1
        if err is None:
            old = self._duration.get(name)
            self._duration[name] = t1 - start if old is None else 0.8 * old + 0.2 * (t1 - start)
        return [lid, start, t1, err.to_dict() if err is not None else None]


def _wait_outputs(leaves: list[Any], donated: set[int]) -> None:
    """Wait for a launch's outputs; an output a later launch already donated is done."""
    for leaf in leaves:
        if leaf.is_deleted():
            continue
        try:
            leaf.block_until_ready()
        except Exception:
            # A later program consumed it (donation), so it was computed. Anything else
            # is the program's own failure.
            if id(leaf) not in donated and not leaf.is_deleted():
                raise


def _finished(leaves: list[Any] | None) -> bool:
    """Whether XLA is done with a launch's outputs (a launch that failed before it ran
    has none); an output a later launch donated is done."""
    return all(leaf.is_deleted() or _is_ready(leaf) for leaf in leaves or ())


def _is_ready(leaf: Any) -> bool:
    # Typed PRNG key arrays have no is_ready; their launches take the completion thread.
    is_ready = getattr(leaf, "is_ready", None)
    return bool(is_ready()) if is_ready is not None else False
