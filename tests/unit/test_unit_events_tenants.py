"""The controller's event log and tenant table."""

from __future__ import annotations

import pytest

from pathways_nb.controller import EventLog, Tenant, Tenants
from pathways_nb.controller._events import FIELDS


def test_event_log_needs_room_for_one_event() -> None:
    with pytest.raises(ValueError, match="at least one event; got 0"):
        EventLog(0)


def test_events_are_lists_in_field_order() -> None:
    log = EventLog(10)
    log.add("launch", 3, 17, "train_step", "s1", "island-a", "h0", "queued", at=5.0)
    assert log.since(0.0) == [
        [5.0, "launch", 3, 17, "train_step", "s1", "island-a", "h0", "queued"]
    ]
    assert len(FIELDS) == len(log.since(0.0)[0])
    assert FIELDS[0] == "time" and FIELDS[2] == "tenant"


def test_the_ring_keeps_the_newest_events_and_counts_them_all() -> None:
    log = EventLog(3)
    for i in range(5):
        log.add("end", lid=i, at=float(i))
    assert len(log) == 3
    assert log.total == 5
    assert [ev[3] for ev in log.since(0.0)] == [2, 3, 4]


def test_since_is_inclusive_and_does_not_stop_at_out_of_order_times() -> None:
    log = EventLog(10)
    for lid, at in enumerate([1.0, 3.0, 2.0, 5.0, 0.5]):
        log.add("start", lid=lid, at=at)
    assert [ev[3] for ev in log.since(2.0)] == [1, 2, 3]
    assert [ev[3] for ev in log.since(5.0)] == [3]
    assert log.since(6.0) == []


def test_since_filters_by_tenant_and_shows_tenant_zero_to_all() -> None:
    log = EventLog(10)
    log.add("host_join", at=1.0)
    log.add("launch", tenant=1, lid=1, at=2.0)
    log.add("launch", tenant=2, lid=2, at=3.0)
    log.add("tenant_leave", tenant=1, at=4.0)
    assert [(ev[1], ev[2]) for ev in log.since(0.0, tenant=1)] == [
        ("host_join", 0),
        ("launch", 1),
        ("tenant_leave", 1),
    ]
    assert [ev[2] for ev in log.since(0.0, tenant=2)] == [0, 2]
    assert [ev[2] for ev in log.since(0.0)] == [0, 1, 2, 1]


def test_since_limit_keeps_the_newest() -> None:
    log = EventLog(100)
    for i in range(10):
        log.add("end", lid=i, at=float(i))
    assert [ev[3] for ev in log.since(0.0, limit=3)] == [7, 8, 9]
    assert [ev[3] for ev in log.since(8.0, limit=3)] == [8, 9]


def test_tenants_get_increasing_ids_and_default_names() -> None:
    ts = Tenants()
    a = ts.add(b"id-a", "alice", weight=2.0)
    b = ts.add(b"id-b", "")
    assert (a.tenant, a.name, a.weight) == (1, "alice", 2.0)
    assert (b.tenant, b.name, b.weight) == (2, "tenant-2", 1.0)
    assert ts.by_id == {1: a, 2: b}
    assert ts.by_identity == {b"id-a": a, b"id-b": b}


def test_adding_a_known_identity_returns_the_same_tenant() -> None:
    ts = Tenants()
    a = ts.add(b"id-a", "alice")
    assert ts.add(b"id-a", "someone else", weight=5.0) is a
    assert (a.name, a.weight) == ("alice", 1.0)
    assert len(ts.by_id) == 1


def test_remove_forgets_both_keys_and_a_returning_identity_gets_a_new_id() -> None:
    ts = Tenants()
    a = ts.add(b"id-a", "alice")
    assert ts.remove(a.tenant) is a
    assert ts.remove(a.tenant) is None
    assert ts.by_id == {} and ts.by_identity == {}
    assert ts.add(b"id-a", "alice").tenant == 2


def test_expired_lists_tenants_silent_for_longer_than_the_lease() -> None:
    ts = Tenants()
    fresh, edge, stale = (ts.add(bytes([i]), f"t{i}") for i in range(3))
    fresh.last_seen, edge.last_seen, stale.last_seen = 95.0, 70.0, 69.5
    assert ts.expired(30.0, now=100.0) == [stale]
    assert ts.expired(0.0, now=95.0) == [edge, stale]
    assert ts.expired(1000.0, now=100.0) == []


def test_a_tenant_starts_with_no_work() -> None:
    t = Tenant(1, b"x", "x", last_seen=0.0)
    assert (t.launches, t.pending, t.device_seconds) == (0, 0, 0.0)


def test_after_returns_only_events_logged_since_a_cursor() -> None:
    log = EventLog(4)
    for i in range(3):
        log.add("launch", tenant=1, lid=i + 1)
    events, nxt = log.after(0)
    assert [e[3] for e in events] == [1, 2, 3] and nxt == 3
    assert log.after(nxt) == ([], 3)
    log.add("start", tenant=2, lid=9)
    log.add("end", tenant=1, lid=1)
    log.add("end", tenant=1, lid=2)  # the ring holds 4: lids 1 and 2 of the launches fell off
    events, nxt = log.after(3)
    assert [(e[1], e[3]) for e in events] == [("start", 9), ("end", 1), ("end", 2)] and nxt == 6
    events, _ = log.after(0)  # what fell off is gone; the rest comes back in order
    assert [e[3] for e in events] == [3, 9, 1, 2]
    assert [e[3] for e in log.after(3, tenant=1)[0]] == [1, 2]
    assert log.after(99) == ([], 6)  # a cursor from the future: nothing yet
    assert [e[3] for e in log.after(5)[0]] == [2]  # the newest alone, from a full ring
