"""A host's answers to many-array waits and fetches: all done at once, or as they finish,
and the index of the array that failed."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import pytest

from pathways_nb._core import RemoteError, encode_dtype
from pathways_nb.worker._answers import Answers
from pathways_nb.worker._store import ObjectStore


@pytest.fixture
def answered() -> Iterator[tuple[ObjectStore, Answers, list[dict[str, Any]]]]:
    store = ObjectStore()
    sent: list[dict[str, Any]] = []

    def to_client(identity: bytes, header: dict[str, Any], bufs: Sequence[Any]) -> None:
        sent.append({**header, "nbufs": len(bufs)})

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield store, Answers("h", store, to_client, pool), sent


def _put(store: ObjectStore, handle: int, value: float) -> None:
    store.set(handle, jax.numpy.full(3, value, np.float32), 12, origin=("p", "s"), ready=True)


def test_a_wait_for_arrays_all_done_is_answered_at_once(answered: Any) -> None:
    store, answers, sent = answered
    for h in range(1, 401):
        _put(store, h, h)
    answers.many(b"c", 7, "wait_many", list(range(1, 401)))
    assert sent == [{"t": "reply", "rid": 7, "nbufs": 0}]
    assert store.statistics().waiters == 0


def test_a_fetch_of_arrays_all_done_sends_each_in_order(answered: Any) -> None:
    store, answers, sent = answered
    for h in (5, 6, 7):
        _put(store, h, h)
    answers.many(b"c", 8, "fetch_many", [7, 5, 6])
    assert sent == [
        {
            "t": "arrays",
            "rid": 8,
            "shapes": [[3]] * 3,
            "dtypes": [encode_dtype(np.dtype(np.float32))] * 3,
            "key_impls": [""] * 3,
            "nbufs": 3,
        }
    ]


def test_the_first_failed_array_among_done_ones_is_named_by_index(answered: Any) -> None:
    store, answers, sent = answered
    _put(store, 1, 1)
    store.fail(2, RemoteError("first", kind="runtime", program="f"))
    store.fail(3, RemoteError("second", kind="runtime", program="g"))
    answers.many(b"c", 9, "wait_many", [1, 2, 3])
    assert len(sent) == 1 and sent[0]["t"] == "failed" and sent[0]["index"] == 1
    assert sent[0]["error"]["message"] == "first"


def test_an_array_that_cannot_be_waited_for_is_named_by_index(answered: Any) -> None:
    store, answers, sent = answered
    _put(store, 1, 1)
    _put(store, 2, 2)
    gone = store.get(2)
    assert gone is not None
    gone.value.delete()  # as a donation does to a buffer the store still names
    answers.many(b"c", 10, "wait_many", [1, 2])
    assert len(sent) == 1 and sent[0]["t"] == "failed" and sent[0]["index"] == 1
    assert "deleted" in sent[0]["error"]["message"]


def test_a_wait_with_pending_arrays_is_answered_when_the_last_arrives(answered: Any) -> None:
    store, answers, sent = answered
    _put(store, 1, 1)
    store.set_many([2, 3], [np.ones(3), np.ones(3)], [24, 24], ("p", "s"))  # not yet computed
    answers.many(b"c", 11, "wait_many", [1, 2, 3])
    assert sent == [] and store.statistics().waiters == 2  # the first was done
    store.mark_ready([2])
    assert sent == []
    store.mark_ready([3])
    assert sent == [{"t": "reply", "rid": 11, "nbufs": 0}]
