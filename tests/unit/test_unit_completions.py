"""A host's completions: launches XLA finished inline are recorded at once; the rest
wait, in order, on the completion thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from pathways_nb.worker._completion import Completions, Done
from pathways_nb.worker._store import Entry, ObjectStore


class _Leaf:
    """Stands in for a jax.Array whose computation ends when ``done`` is set."""

    def __init__(self, done: bool = True) -> None:
        self.done = threading.Event()
        if done:
            self.done.set()

    def is_ready(self) -> bool:
        return self.done.is_set()

    def is_deleted(self) -> bool:
        return False

    def block_until_ready(self) -> _Leaf:
        self.done.wait(10)
        return self


def _setup() -> tuple[Completions, ObjectStore, list[dict[str, Any]]]:
    store = ObjectStore()
    sent: list[dict[str, Any]] = []
    return Completions("h", store, sent.append, window=4), store, sent


def _launch(c: Completions, store: ObjectStore, lid: int, leaf: _Leaf) -> None:
    store.set_many([lid * 10], [leaf], [4], ("f", "s"))
    c.received += 1
    c.dispatched(Done(lid, [lid * 10], [leaf], time.time(), None, "f", "s", []))


def test_a_launch_finished_inline_is_acknowledged_and_answered_at_once() -> None:
    c, store, sent = _setup()
    answered: list[Entry] = []
    store.set_many([10], [None], [4], ("f", "s"))
    store.when_ready(10, answered.append)
    _launch(c, store, 1, _Leaf(done=True))
    # No completion thread runs: the dispatching thread recorded it.
    assert [item[0] for item in sent[0]["items"]] == [1]
    assert len(answered) == 1 and c.completed == 1


def test_a_launch_still_running_waits_for_the_completion_thread_in_order() -> None:
    c, store, sent = _setup()
    slow = _Leaf(done=False)
    _launch(c, store, 1, slow)
    _launch(c, store, 2, _Leaf(done=True))  # behind a running launch: not recorded early
    assert sent == [] and c.completed == 0
    # No dispatcher calls reap() here: the completion thread finds them on its own.
    loop = threading.Thread(target=c.loop)
    loop.start()
    slow.done.set()
    deadline = time.monotonic() + 10
    while c.completed < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    c.stop()
    loop.join(10)
    assert not loop.is_alive()
    acked = [item[0] for msg in sent for item in msg["items"]]
    assert acked == [1, 2]
    starts = {item[0]: item[1] for msg in sent for item in msg["items"]}
    assert starts[2] >= starts[1]


def test_the_dispatcher_records_what_xla_finished_when_it_goes_idle() -> None:
    c, store, sent = _setup()
    first = _Leaf(done=False)
    _launch(c, store, 1, first)
    _launch(c, store, 2, _Leaf(done=True))
    c.reap()  # the first is still running: nothing is recorded out of order
    assert sent == [] and c.completed == 0
    first.done.set()
    senders: list[str] = []
    c._send = lambda msg: (senders.append(threading.current_thread().name), sent.append(msg))
    c.reap()
    # Recorded by the calling thread, oldest first, in one acknowledgement: no
    # completion thread had to wake for them.
    assert [item[0] for item in sent[0]["items"]] == [1, 2]
    assert senders == [threading.current_thread().name] and c.completed == 2
    answered: list[Entry] = []
    store.when_ready(20, answered.append)
    assert len(answered) == 1 and answered[0].ready
