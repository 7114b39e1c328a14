"""A host's object store: values, errors, byte accounting and parked waiters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pathways_nb._core import DataLossError, RemoteError, ResourceExhaustedError
from pathways_nb.worker import ObjectStore, StoreStatistics
from pathways_nb.worker._store import Entry


def test_set_get_and_statistics() -> None:
    store = ObjectStore(limit=1000)
    store.set(1, "a", 100, origin=("f", "s1"))
    store.set(2, "b", 50)
    store.fail(3, RemoteError("boom"))
    assert store.get(1) == Entry(value="a", nbytes=100, origin=("f", "s1"))
    assert store.get(4) is None
    assert store.bytes == 150
    assert store.statistics() == StoreStatistics(
        arrays=2, errors=1, bytes=150, limit=1000, waiters=0, tenant_max_bytes=150
    )


def test_setting_a_handle_again_replaces_its_bytes() -> None:
    store = ObjectStore()
    store.set(1, "a", 100)
    store.set(1, "b", 40)
    assert store.bytes == 40
    err = RemoteError("gone")
    store.fail(1, err)
    assert store.bytes == 0
    entry = store.get(1)
    assert entry is not None and entry.error is err and entry.value is None


def test_drop_counts_what_was_present_and_frees_its_bytes() -> None:
    store = ObjectStore()
    for h in (1, 2, 3):
        store.set(h, h, 10 * h)
    assert store.drop([1, 3, 9]) == 2
    assert store.bytes == 20
    assert store.drop([1]) == 0
    assert store.statistics().arrays == 1


def test_no_limit_never_refuses() -> None:
    store = ObjectStore(limit=0)
    store.set(1, "big", 2**40)
    store.reserve_check(2**40)


def test_reserve_check_names_the_limit_and_the_fix() -> None:
    store = ObjectStore(limit=100)
    store.set(1, "a", 60)
    store.reserve_check(40)
    with pytest.raises(ResourceExhaustedError) as info:
        store.reserve_check(41)
    err = info.value
    assert err.kind == "resource_exhausted"
    assert err.message == (
        "the object store would hold 101 bytes, over its limit of 100 (now 60 resident). "
        "Delete arrays you no longer need (`del x` or `x.delete()`) or raise "
        "PATHWAYS_STORE_LIMIT_BYTES"
    )
    # Bytes about to be freed (a donated input) make room.
    store.reserve_check(50, freeing=10)
    with pytest.raises(ResourceExhaustedError, match="would hold 101 bytes"):
        store.reserve_check(51, freeing=10)
    assert store.bytes == 60  # a check reserves nothing


def test_a_waiter_on_a_ready_handle_is_called_at_once() -> None:
    store = ObjectStore()
    store.set(1, "a", 8, ready=True)
    seen: list[Entry] = []
    store.when_ready(1, seen.append)
    assert seen == [Entry(value="a", nbytes=8, ready=True)]
    assert store.statistics().waiters == 0


def test_parked_waiters_are_called_once_in_order_when_the_value_arrives() -> None:
    store = ObjectStore()
    seen: list[tuple[str, object]] = []
    store.when_ready(1, lambda e: seen.append(("first", e.value)))
    store.when_ready(1, lambda e: seen.append(("second", e.value)))
    store.when_ready(2, lambda e: seen.append(("other", e.value)))
    assert seen == []
    assert store.statistics().waiters == 3
    store.set(1, "a", 8)  # present, still computing
    assert seen == []
    store.mark_ready([1])
    assert seen == [("first", "a"), ("second", "a")]
    store.set(1, "b", 8, ready=True)
    assert seen == [("first", "a"), ("second", "a")]
    assert store.statistics().waiters == 1


def test_a_parked_waiter_receives_a_failure() -> None:
    store = ObjectStore()
    seen: list[Entry] = []
    store.when_ready(5, seen.append)
    err = DataLossError("host lost")
    store.fail(5, err)
    assert len(seen) == 1 and seen[0].error is err and seen[0].nbytes == 0


def test_a_waiter_on_a_dropped_handle_hears_it_was_deleted() -> None:
    """Nothing stores a handle again once it is dropped: its waiters (a fetch that came
    before the deletion, say) are answered then, not kept for ever."""
    store = ObjectStore()
    seen: list[Entry] = []
    store.set(7, "pending", 8)  # an output whose program has not finished
    store.when_ready(7, seen.append)
    store.when_ready(9, seen.append)  # never stored
    assert store.drop([7, 9]) == 1
    assert [e.error.message for e in seen if e.error is not None] == [
        "array 0x7 was deleted",
        "array 0x9 was deleted",
    ]
    assert store.statistics().waiters == 0


def test_fail_waiters_answers_every_parked_waiter_once() -> None:
    store = ObjectStore()
    seen: list[tuple[int, str]] = []

    def waiter(handle: int) -> Callable[[Entry], None]:
        def called(e: Entry) -> None:
            assert e.error is not None
            seen.append((handle, e.error.message))

        return called

    store.when_ready(1, waiter(1))
    store.when_ready(1, waiter(1))
    store.when_ready(2, waiter(2))
    store.fail_waiters(lambda h: RemoteError(f"host stopping before handle {h}"))
    assert seen == [
        (1, "host stopping before handle 1"),
        (1, "host stopping before handle 1"),
        (2, "host stopping before handle 2"),
    ]
    assert store.statistics().waiters == 0
    store.set(1, "late", 8)
    assert len(seen) == 3
    assert store.get(1) == Entry(value="late", nbytes=8)


def test_wait_returns_the_entry_or_none_on_timeout() -> None:
    store = ObjectStore()
    assert store.wait(1, timeout=0.0) is None
    store.fail(1, RemoteError("x"))
    entry = store.wait(1, timeout=0.0)
    assert entry is not None and entry.error is not None
    store.drop([1])
    assert store.wait(1, timeout=0.0) is None


def test_set_many_stores_a_launchs_outputs_not_yet_ready() -> None:
    store = ObjectStore()
    store.set_many([1, 2], ["a", "b"], [8, 4], ("prog", "slice0"))
    assert store.bytes == 12
    assert store.get(2) == Entry(value="b", nbytes=4, origin=("prog", "slice0"))
    seen: list[Entry] = []
    store.when_ready(1, seen.append)
    assert seen == []  # computed only once the completion thread says so
    store.mark_ready([1, 2])
    assert [e.value for e in seen] == ["a"]
    with pytest.raises(ValueError, match="2 handles for 1 outputs"):
        store.set_many([3, 4], ["c"], [1], ("p", "s"))


def test_get_many_returns_entries_in_order_or_none_if_one_is_absent() -> None:
    store = ObjectStore()
    store.set(1, "a", 8)
    store.set(2, "b", 8)
    entries = store.get_many([2, 1])
    assert entries is not None and [e.value for e in entries] == ["b", "a"]
    assert store.get_many([1, 3]) is None
    assert store.get_many([]) == []
    # computed=True: None while one is not yet computed; failed ones count as done.
    store.set_many([4], ["d"], [8], ("p", "s"))
    store.fail(5, RemoteError("boom"))
    store.mark_ready([1])
    assert store.get_many([1, 4], computed=True) is None
    assert store.get_many([1, 4]) is not None
    store.mark_ready([4])
    done = store.get_many([1, 4, 5], computed=True)
    assert done is not None and [e.value for e in done[:2]] == ["a", "d"]
    assert done[2].error is not None


def test_watched_absent_handles_call_on_arrival_once_when_stored() -> None:
    store = ObjectStore()
    calls: list[int] = []
    store.on_arrival = lambda: calls.append(1)
    store.set(1, "a", 8)
    assert store.watch_absent([1, 2, 3]) == [2, 3]
    store.set(4, "d", 8)
    assert calls == []  # not watched
    store.set_many([2], ["b"], [8], ("p", "s"))
    assert calls == [1]
    store.fail(3, RemoteError("gone", kind="data_loss"))
    assert calls == [1, 1]
    store.set(3, "c", 8)
    assert calls == [1, 1]  # no longer watched
    store.watch_absent([5])
    store.unwatch([5])
    store.set(5, "e", 8)
    assert calls == [1, 1]


def test_a_tenant_quota_counts_each_owners_bytes_apart() -> None:
    from pathways_nb._core._ids import TENANT_SHIFT

    def of(tenant: int, n: int) -> int:
        return (tenant << TENANT_SHIFT) | n

    store = ObjectStore(limit=0, tenant_limit=100)
    store.set(of(1, 1), "a", 60)
    store.set_many([of(1, 2), of(2, 1)], ["b", "c"], [30, 90], ("p", "s"))
    assert sorted(store.tenant_bytes()) == [[1, 90], [2, 90]]
    store.reserve_check(10, tenant=1)
    with pytest.raises(ResourceExhaustedError) as info:
        store.reserve_check(11, tenant=1)
    assert info.value.message == (
        "this client's arrays on this host would take 101 bytes, over the 100 bytes one "
        "client may keep on a host (now 90; PATHWAYS_TENANT_STORE_BYTES, set where the "
        "controller runs). Delete arrays you no longer need (`del x` or `x.delete()`), "
        "or ask the cluster's operator to raise the quota"
    )
    store.reserve_check(11, freeing=1, tenant=1)  # a donated input makes room
    store.reserve_check(10, tenant=2)
    store.reserve_check(10**6)  # no tenant named: only the store's own limit applies
    # Overwriting, failing and dropping handles move their owner's count.
    store.set(of(1, 1), "a2", 20)
    store.fail(of(1, 2), RemoteError("x"))
    assert sorted(store.tenant_bytes()) == [[1, 20], [2, 90]]
    store.drop([of(1, 1)])
    assert store.tenant_bytes() == [[2, 90]]
    stats = store.statistics()
    assert (stats.tenant_limit, stats.tenant_max_bytes, stats.bytes) == (100, 90, 90)


def test_the_stores_own_limit_is_checked_before_a_tenants_quota() -> None:
    store = ObjectStore(limit=50, tenant_limit=100)
    with pytest.raises(ResourceExhaustedError, match="over its limit of 50"):
        store.reserve_check(60, tenant=1)
