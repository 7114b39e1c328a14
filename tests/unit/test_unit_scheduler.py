"""The gang scheduler as a state machine: submissions in, dispatch lists out."""

from __future__ import annotations

import collections
import itertools

import pytest

from pathways_nb.controller import GangScheduler, Work

_lids = itertools.count(1)


def run(tenant: int, island: str = "i0", cost_key: str = "step") -> Work:
    return Work("run", tenant, island, next(_lids), cost_key=cost_key)


def drop(tenant: int, island: str = "i0") -> Work:
    return Work("drop", tenant, island, 0, body=[tenant])


def scheduler(window: int, **islands: str) -> GangScheduler:
    s = GangScheduler(window)
    for island, key in (islands or {"i0": "p0"}).items():
        s.add_island(island, key)
    return s


def test_configuration_errors_say_what_was_given() -> None:
    with pytest.raises(ValueError, match="at least 1; got 0"):
        GangScheduler(0)
    s = scheduler(1)
    with pytest.raises(ValueError, match="weight must be positive; got -2"):
        s.set_weight(1, -2)
    with pytest.raises(KeyError, match="unknown island 'nowhere'"):
        s.submit(run(1, "nowhere"))


def test_one_tenant_is_first_in_first_out_within_the_window() -> None:
    s = scheduler(2)
    works = [run(1) for _ in range(5)]
    for w in works:
        s.submit(w)
    assert s.dispatch() == works[:2]
    assert s.dispatch() == []
    assert s.complete(works[0].lid, 0.01) is works[0]
    assert s.dispatch() == [works[2]]
    st = s.statistics()
    assert (st.queued, st.inflight, st.dispatched, st.completed) == ({"i0": 2}, {"p0": 2}, 3, 1)


def test_complete_of_an_unknown_or_finished_launch_is_ignored() -> None:
    s = scheduler(1)
    w = run(1)
    s.submit(w)
    s.dispatch()
    assert s.complete(w.lid) is w
    assert s.complete(w.lid) is None
    assert s.complete(123456) is None
    assert s.statistics().completed == 1
    assert s.statistics().inflight == {}


def test_islands_sharing_a_window_key_never_exceed_the_window() -> None:
    s = scheduler(3, i0="proc", i1="proc", i2="other")
    for island in ("i0", "i1", "i2"):
        for t in (1, 2):
            for _ in range(6):
                s.submit(run(t, island))
    inflight: collections.deque[Work] = collections.deque()
    done = collections.Counter[str]()
    peak = collections.Counter[str]()
    while True:
        inflight.extend(s.dispatch())
        per_key = collections.Counter("other" if w.island == "i2" else "proc" for w in inflight)
        assert per_key["proc"] <= 3 and per_key["other"] <= 3
        assert s.statistics().inflight == {k: v for k, v in per_key.items() if v}
        peak |= per_key
        if not inflight:
            break
        w = inflight.popleft()
        done[w.island] += 1
        s.complete(w.lid, 0.01)
    assert done == {"i0": 12, "i1": 12, "i2": 12}
    assert peak == {"proc": 3, "other": 3}


def test_a_drop_needs_no_window_slot() -> None:
    s = scheduler(1)
    first = run(1)
    s.submit(first)
    assert s.dispatch() == [first]
    d = drop(1)
    s.submit(d)
    assert s.dispatch() == [d]
    st = s.statistics()
    assert (st.inflight, st.dispatched, st.completed) == ({"p0": 1}, 1, 0)


def test_a_drop_behind_a_blocked_run_keeps_its_tenants_order() -> None:
    s = scheduler(1)
    first, second, d = run(1), run(1), drop(1)
    for w in (first, second, d):
        s.submit(w)
    assert s.dispatch() == [first]
    assert s.dispatch() == []
    s.complete(first.lid, 0.01)
    assert s.dispatch() == [second, d]


def test_another_tenants_drop_is_not_held_by_a_blocked_run() -> None:
    s = scheduler(1)
    first, second = run(1), run(1)
    s.submit(first)
    assert s.dispatch() == [first]
    s.submit(second)
    d = drop(2)
    s.submit(d)
    assert s.dispatch() == [d]


def test_cancel_returns_queued_runs_and_keeps_drops() -> None:
    s = scheduler(1, i0="p0", i1="p1")
    busy = run(1)
    s.submit(busy)
    assert s.dispatch() == [busy]
    queued = [run(1), run(1, "i1")]
    d = drop(1)
    for w in (queued[0], d, queued[1]):
        s.submit(w)
    assert sorted(w.lid for w in s.cancel(1)) == sorted(w.lid for w in queued)
    assert s.cancel(1) == []
    assert s.cancel(99) == []
    # The drop goes out at once; the in-flight run stays in flight.
    assert s.dispatch() == [d]
    assert s.statistics().inflight == {"p0": 1}
    assert s.statistics().queued == {"i0": 0, "i1": 0}
    other = run(2)
    s.submit(other)
    assert s.dispatch() == []
    s.complete(busy.lid, 0.01)
    assert s.dispatch() == [other]


def test_fail_island_returns_queued_and_inflight_runs_of_that_island() -> None:
    s = scheduler(2, i0="p0", i1="p0")
    a1, a2, a3, b1 = run(1, "i0"), run(1, "i0"), run(2, "i0"), run(1, "i1")
    s.submit(a1)
    s.submit(a2)
    assert sorted(w.lid for w in s.dispatch()) == [a1.lid, a2.lid]
    s.submit(a3)
    s.submit(drop(1, "i0"))
    s.submit(b1)
    failed = s.fail_island("i0")
    assert sorted(w.lid for w in failed) == [a1.lid, a2.lid, a3.lid]
    assert s.complete(a1.lid, 0.01) is None
    assert s.statistics().queued == {"i1": 1}
    with pytest.raises(KeyError):
        s.submit(run(1, "i0"))
    s.add_island("i0", "p0")  # the host came back
    s.submit(b2 := run(1, "i0"))
    assert sorted(w.lid for w in s.dispatch()) == sorted([b1.lid, b2.lid])


def test_fail_island_wakes_islands_sharing_its_window() -> None:
    s = scheduler(1, i0="proc", i1="proc")
    a, b = run(1, "i0"), run(1, "i1")
    s.submit(a)
    assert s.dispatch() == [a]
    s.submit(b)
    assert s.dispatch() == []
    assert s.fail_island("i0") == [a]
    assert s.dispatch() == [b]


def test_measured_cost_is_an_exponential_moving_average_over_the_weight() -> None:
    s = scheduler(1)
    s.set_weight(1, 2.0)
    expected = 0.0
    for seconds, cost in [(1.0, 1e-3), (0.5, 1.0), (None, 0.9), (2.0, 0.9)]:
        w = run(1, cost_key="f")
        s.submit(w)
        assert s.dispatch() == [w]
        expected += cost / 2.0  # the cost known when the launch left
        assert s.statistics().passes["i0"][1] == pytest.approx(expected)
        s.complete(w.lid, seconds)
    # 0.8 * 0.9 + 0.2 * 2.0
    w = run(1, cost_key="f")
    s.submit(w)
    s.dispatch()
    assert s.statistics().passes["i0"][1] == pytest.approx(expected + 1.12 / 2.0)


def test_a_newcomer_starts_level_with_the_busy_tenants() -> None:
    s = scheduler(8)
    for t, n in ((1, 6), (2, 6)):
        for _ in range(n):
            s.submit(run(t))
    s.dispatch()  # 8 leave (4 each, alternating), 2 + 2 stay queued
    assert s.statistics().passes["i0"] == pytest.approx({1: 4e-3, 2: 4e-3})
    s.submit(run(3))
    assert s.statistics().passes["i0"][3] == pytest.approx(4e-3)
    # With nobody queued, a newcomer starts a competition level with the tenants before:
    # at the largest pass, which a tenant who ran alone meanwhile has (what it ran took
    # nothing from anyone).
    idle = scheduler(8)
    idle.submit(run(5))
    idle.dispatch()
    idle.submit(run(6))
    assert idle.statistics().passes["i0"][6] == pytest.approx(1e-3)


def test_forget_tenant_drops_an_idle_tenant() -> None:
    s = scheduler(8)
    s.submit(run(1))
    s.dispatch()
    s.forget_tenant(1)
    assert 1 not in s.statistics().passes["i0"]


def shares(s: GangScheduler, costs: dict[int, float], launches: int) -> collections.Counter[int]:
    """Keep every tenant's queue full; complete each launch, oldest first."""
    for t in costs:
        for _ in range(s.window + 1):
            s.submit(run(t, cost_key=f"prog{t}"))
    got = collections.Counter[int]()
    inflight: collections.deque[Work] = collections.deque()
    while sum(got.values()) < launches:
        for w in s.dispatch():
            got[w.tenant] += 1
            inflight.append(w)
            s.submit(run(w.tenant, cost_key=w.cost_key))
        w = inflight.popleft()
        s.complete(w.lid, costs[w.tenant])
    return got


@pytest.mark.parametrize("window", [1, 4])
def test_weights_one_and_three_share_launches_one_to_three(window: int) -> None:
    s = scheduler(window)
    s.set_weight(1, 1.0)
    s.set_weight(2, 3.0)
    got = shares(s, {1: 0.01, 2: 0.01}, 400)
    total = sum(got.values())
    assert total - 400 < window
    assert got[2] / total == pytest.approx(0.75, abs=0.02)


def test_equal_weights_share_device_time_not_launch_counts() -> None:
    s = scheduler(2)
    got = shares(s, {1: 0.03, 2: 0.01}, 400)
    time1, time2 = got[1] * 0.03, got[2] * 0.01
    assert time1 / (time1 + time2) == pytest.approx(0.5, abs=0.02)
    assert got[2] / got[1] == pytest.approx(3.0, rel=0.05)


def test_a_tenant_returning_from_idle_does_not_starve_the_others() -> None:
    s = scheduler(1)
    shares(s, {1: 0.01}, 1)
    s.cancel(1)
    shares(s, {2: 0.01}, 50)  # tenant 1 sits idle while tenant 2 works
    got = shares(s, {1: 0.01, 2: 0.01}, 20)
    assert got[2] >= 8


def test_tenants_returning_together_share_by_weight_whoever_ran_alone_last() -> None:
    """Both tenants go idle, the heavy one first (the light one then runs alone), and
    both come back at once: they share by weight from the first launch, as before."""
    s = scheduler(1)
    s.set_weight(1, 3.0)
    s.set_weight(2, 1.0)
    for _ in range(3):
        shares(s, {1: 0.01, 2: 0.01}, 40)
        s.cancel(1)  # the heavy tenant is done
        shares(s, {2: 0.01}, 30)  # the light one runs alone
        s.cancel(2)
        while s.inflight_lids():
            s.complete(next(iter(s.inflight_lids())), 0.01)
        got = shares(s, {1: 0.01, 2: 0.01}, 40)
        assert 27 <= got[1] <= 33, got
        s.cancel(1)
        s.cancel(2)
        while s.inflight_lids():
            s.complete(next(iter(s.inflight_lids())), 0.01)


def test_one_dear_warm_up_launch_does_not_hand_the_next_backlog_to_the_other() -> None:
    """A program's first run is slow (caches, page faults): the next tenant's first launch
    of it is charged that estimate while nobody else waits. When both then queue a
    backlog, they share by weight from the start."""
    s = scheduler(1)
    s.set_weight(1, 3.0)
    s.set_weight(2, 1.0)
    for tenant, seconds in ((1, 0.5), (2, 0.001)):
        w = run(tenant, cost_key="prog")
        s.submit(w)
        assert s.dispatch() == [w]
        s.complete(w.lid, seconds)
    got = shares(s, {1: 0.01, 2: 0.01}, 40)
    assert 27 <= got[1] <= 33, got


def test_a_tenant_on_several_islands_gets_its_share_of_each() -> None:
    """Passes are per island: what a tenant runs on another island (another stage of its
    pipeline) does not cost it its share of the island it shares with another tenant."""
    s = scheduler(4, i0="p0", i1="p1")
    s.set_weight(1, 1.0)
    s.set_weight(2, 3.0)
    for _ in range(5):
        s.submit(run(1, "i0", "a"))
        s.submit(run(1, "i1", "b"))
        s.submit(run(2, "i1", "b"))
    got = collections.Counter[tuple[int, str]]()
    inflight: collections.deque[Work] = collections.deque()
    while sum(got.values()) < 2000:
        for w in s.dispatch():
            got[(w.tenant, w.island)] += 1
            inflight.append(w)
            s.submit(run(w.tenant, w.island, w.cost_key))
        s.complete(inflight.popleft().lid, 0.01)
    on_i1 = got[(2, "i1")] / (got[(1, "i1")] + got[(2, "i1")])
    assert 0.72 <= on_i1 <= 0.78, got


class _Checked(GangScheduler):
    """Checks every choice against a scan of all queued tenants."""

    def _pick(self, q):  # type: ignore[no-untyped-def]
        tenant = super()._pick(q)
        queued = {t: q.passes[t] for t, dq in q.queues.items() if dq}
        if tenant is None:
            assert not queued
        else:
            assert queued[tenant] == min(queued.values())
        return tenant

    def _heads_needing_no_slot(self, q):  # type: ignore[no-untyped-def]
        assert q.free_heads == {t for t, dq in q.queues.items() if dq[0].kind != "run"}
        out = super()._heads_needing_no_slot(q)
        assert all(dq[0].kind == "run" for dq in q.queues.values())
        return out


def test_the_next_tenant_is_the_least_advanced_among_many_in_any_sequence() -> None:
    import random

    rng = random.Random(7)
    s = _Checked(4)
    for island in ("i0", "i1", "i2"):
        s.add_island(island, f"p{island}")
    for tenant in range(1, 41):
        s.set_weight(tenant, rng.choice([0.5, 1.0, 3.0]))
    inflight: list[int] = []
    for _ in range(5000):
        op = rng.random()
        if op < 0.55:
            w = run(rng.randint(1, 40), rng.choice(["i0", "i1", "i2"]), rng.choice("abc"))
            s.submit(w)
        elif op < 0.6:
            s.submit(drop(rng.randint(1, 40), rng.choice(["i0", "i1", "i2"])))
        elif op < 0.62:
            s.cancel(rng.randint(1, 40))
        elif op < 0.8 and inflight:
            s.complete(inflight.pop(rng.randrange(len(inflight))), rng.random() * 1e-3)
        inflight.extend(w.lid for w in s.dispatch() if w.kind == "run")
    assert s.statistics().dispatched > 500
