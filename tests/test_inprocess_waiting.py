"""pw.wait and pw.as_completed: arrays taken in the order their programs finish."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from _interrupts import interrupted_when_blocked_in, outcomes
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


@pytest.fixture
def two(client: pw.Client) -> tuple[pw.VirtualSlice, pw.VirtualSlice]:
    a = client.allocate({"x": 2}, name="a")
    b = client.allocate({"x": 2}, name="b")
    assert a.host != b.host  # each on an island of its own: one host's delay holds only it
    return a, b


def same(got: list[pw.RemoteArray], want: list[pw.RemoteArray]) -> bool:
    """The same arrays in the same order (``==`` on arrays compares their values)."""
    return len(got) == len(want) and all(g is w for g, w in zip(got, want, strict=True))


def _slow_and_fast(
    client: pw.Client, a: pw.VirtualSlice, b: pw.VirtualSlice, delay: float = 1.0
) -> tuple[pw.RemoteArray, pw.RemoteArray]:
    client.inject_fault(a, match="slow", kind=f"delay:{delay}")
    slow = pw.jit(lambda v: v * 3.0, name="slow")(a.put(np.arange(4, dtype=np.float32), P("x")))
    fast = pw.jit(lambda v: v + 1.0, name="fast")(b.put(np.arange(4, dtype=np.float32), P("x")))
    return slow, fast


def test_wait_first_completed_then_all(client: pw.Client, two: tuple[pw.VirtualSlice, ...]) -> None:
    slow, fast = _slow_and_fast(client, *two)
    done, not_done = pw.wait([slow, fast], return_when="FIRST_COMPLETED")
    assert same(done, [fast]) and same(not_done, [slow])
    assert fast.is_ready() and not slow.is_ready()
    np.testing.assert_array_equal(fast.fetch(), np.arange(4, dtype=np.float32) + 1)
    done, not_done = pw.wait([slow, fast])
    assert same(done, [slow, fast]) and not_done == []
    assert slow.is_ready()
    np.testing.assert_array_equal(slow.fetch(), np.arange(4, dtype=np.float32) * 3)


def test_wait_timeout_returns_what_is_done(
    client: pw.Client, two: tuple[pw.VirtualSlice, ...]
) -> None:
    slow, fast = _slow_and_fast(client, *two)
    fast.block_until_ready()
    done, not_done = pw.wait([fast, slow], timeout=0.05)
    assert same(done, [fast]) and same(not_done, [slow])
    done, not_done = pw.wait([slow], timeout=0)
    assert done == [] and same(not_done, [slow])
    pw.wait([slow])


def test_waiting_in_a_loop_asks_the_host_once(
    cluster: pw.InProcessCluster, client: pw.Client, two: tuple[pw.VirtualSlice, ...]
) -> None:
    a, _ = two
    slow, _ = _slow_and_fast(client, *two, delay=2.0)
    host = next(h for h in cluster.hosts if h.name == a.host)
    for _ in range(20):
        assert same(pw.wait([slow], timeout=0.01).not_done, [slow])
    assert host.statistics()[0].waiters == 1
    assert same(pw.wait([slow]).done, [slow])


def test_as_completed_in_finishing_order(
    client: pw.Client, two: tuple[pw.VirtualSlice, ...]
) -> None:
    a, b = two
    slow, fast = _slow_and_fast(client, a, b)
    ready = b.put(np.ones(2, np.float32), P("x")) * 5.0
    pw.block_until_ready([fast, ready])
    it = pw.as_completed([slow, ready, fast])
    assert len(it) == 3
    got = list(it)
    # Those known to be computed first, in the order given; then as the hosts answer.
    assert same(got, [ready, fast, slow])
    assert len(it) == 0
    assert [float(x.sum()) for x in got] == [10.0, 10.0, 18.0]


def test_as_completed_takes_each_as_it_finishes(
    client: pw.Client, two: tuple[pw.VirtualSlice, ...]
) -> None:
    slow, fast = _slow_and_fast(client, *two)
    it = pw.as_completed([slow, fast])
    first = next(it)
    assert first is fast and not slow.is_ready()
    assert next(it) is slow
    with pytest.raises(StopIteration):
        next(it)


def test_as_completed_async(client: pw.Client, two: tuple[pw.VirtualSlice, ...]) -> None:
    slow, fast = _slow_and_fast(client, *two, delay=0.5)

    async def collect() -> list[pw.RemoteArray]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        out = [x async for x in pw.as_completed([slow, fast])]
        ticker.cancel()
        assert ticks > 10  # the event loop kept running while the slow one computed
        return out

    assert same(asyncio.run(collect()), [fast, slow])


def test_as_completed_timeout(client: pw.Client, two: tuple[pw.VirtualSlice, ...]) -> None:
    slow, fast = _slow_and_fast(client, *two)
    it = pw.as_completed([slow, fast], timeout=0.3)
    assert next(it) is fast
    with pytest.raises(TimeoutError, match=r"1 of 2 arrays not computed within 0.3 s"):
        next(it)
    pw.wait([slow])


def test_failures_count_as_done(client: pw.Client, two: tuple[pw.VirtualSlice, ...]) -> None:
    a, b = two
    client.inject_fault(a, match="broken", kind="error")
    client.inject_fault(b, match="late", kind="delay:1.0")
    broken = pw.jit(lambda v: v - 1.0, name="broken")(a.put(np.ones(2, np.float32), P("x")))
    late = pw.jit(lambda v: v * 2.0, name="late")(b.put(np.ones(2, np.float32), P("x")))
    done, not_done = pw.wait([late, broken], return_when="FIRST_EXCEPTION")
    assert same(done, [broken]) and same(not_done, [late])
    assert broken.is_ready()
    with pytest.raises(pw.RemoteError, match="injected fault"):
        broken.fetch()
    # Its consumer fails with the same cause, and counts as done too.
    after = broken + 1.0
    assert [x is after for x in pw.as_completed([after])] == [True]
    with pytest.raises(pw.RemoteError, match="injected fault"):
        after.fetch()
    assert pw.wait([late, broken]).not_done == []


def test_bad_input(client: pw.Client) -> None:
    vs = client.allocate({"x": 2})
    x = vs.put(np.ones(2, np.float32), P("x"))
    with pytest.raises(TypeError, match=r"wrap one array as \[x\]"):
        pw.wait(x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item 1 is a ndarray"):
        pw.wait([x, np.ones(2)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got int"):
        pw.as_completed(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"return_when is one of .*got 'FIRST'"):
        pw.wait([x], return_when="FIRST")
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="timeout is seconds"):
            pw.wait([x], timeout=bad)  # type: ignore[arg-type]
    y = x + 1.0
    y.delete()
    with pytest.raises(pw.ClosedError, match="was deleted"):
        pw.wait([y])
    assert pw.wait([]) == ([], [])
    assert same(list(pw.as_completed([x, x])), [x])  # each array once


def test_closing_the_client_ends_a_wait(
    cluster: pw.InProcessCluster, two: tuple[pw.VirtualSlice, ...]
) -> None:
    with cluster.client() as c:
        vs = c.allocate({"x": 2})
        c.inject_fault(vs, match="held", kind="delay:2.0")
        held = pw.jit(lambda v: v + 1.0, name="held")(vs.put(np.ones(2, np.float32), P("x")))
        threading.Timer(0.2, c.close).start()
        with pytest.raises(pw.ClosedError):
            pw.wait([held])


@pytest.mark.parametrize("how", ["wait", "as_completed"])
def test_interrupt_while_waiting_cancels_queued_work(client: pw.Client, how: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    vs = client.allocate({"x": 2})
    client.inject_fault(vs, match="held", kind="delay:5.0")
    x = vs.put(np.ones(2, np.float32), P("x"))
    held = pw.jit(lambda v: v + 1.0, name="held")
    outs = [held(x) for _ in range(50)]
    blocked_in = "wait" if how == "wait" else "__next__"
    with (
        interrupted_when_blocked_in(blocked_in, "_waiting.py"),
        pytest.raises(KeyboardInterrupt),
    ):
        if how == "wait":
            pw.wait(outs)
        else:
            list(pw.as_completed(outs))
    assert "cancelled" in outcomes(client, outs)


def test_as_completed_takes_arrays_added_while_iterating(
    client: pw.Client, two: tuple[pw.VirtualSlice, ...]
) -> None:
    a, _ = two
    client.inject_fault(a, match="first", kind="delay:0.5")
    run = pw.jit(lambda v, k: v * k, name="first")
    later = pw.jit(lambda v, k: v * k, name="later")
    x = {vs.name: vs.put(np.ones(2, np.float32), P("x")) for vs in two}
    # Two runs going at a time, the next launched on the slice that came free.
    runs = [run(x["a"], 1.0), run(x["b"], 2.0)]
    it = pw.as_completed(runs)
    queue = [3.0, 4.0]
    got = []
    for done in it:
        got.append(float(done.sum()))
        if queue:
            it.add(later(x[done.slice.name], queue.pop(0)))
    assert len(it) == 0
    assert sorted(got) == [2.0, 4.0, 6.0, 8.0] and got[0] == 4.0  # b's first run is fast
    it.add(runs[0])  # given already: not taken twice
    assert len(it) == 0
    with pytest.raises(TypeError, match=r"as_completed\.add takes RemoteArrays"):
        it.add(np.ones(2))  # type: ignore[arg-type]
