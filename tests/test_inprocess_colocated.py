"""pw.colocated: Python functions run on a slice's host, on the arrays it holds.

The in-process cluster's hosts are threads of this process, so a colocated function
here can also touch this test's own state (an event, a counter): that is how the tests
see when, and whether, it ran.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config


@pytest.fixture
def vs(client: pw.Client) -> Iterator[pw.VirtualSlice]:
    s = client.allocate({"x": 4}, name="colo")
    yield s
    s.release()


def _scalar(*_: object) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), np.float32)


def test_a_function_reads_the_hosts_arrays_and_its_results_stay_there(
    vs: pw.VirtualSlice,
) -> None:
    value = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    x = vs.put(value, P("x"))

    @pw.colocated(out=_scalar)
    def spread(v: jax.Array) -> np.float32:
        assert isinstance(v, jax.Array) and len(v.devices()) == 4  # the host's array
        a = np.asarray(v)
        return np.float32(np.percentile(a, 99) - np.percentile(a, 1))

    s = spread(x)
    assert isinstance(s, pw.RemoteArray) and s.slice is vs and s.shape == ()
    want = np.percentile(value, 99) - np.percentile(value, 1)
    assert float(s) == pytest.approx(float(want), rel=1e-6)
    # A result is an array of the slice, as any other: programs take it.
    assert float(pw.jit(lambda a, b: a * b)(s, x.sum())) == pytest.approx(
        float(want) * float(value.sum()), rel=1e-4
    )


def test_outputs_are_placed_as_out_declares_and_arguments_of_every_kind_arrive(
    vs: pw.VirtualSlice,
) -> None:
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = vs.put(value, P("x"))
    local = np.full((4,), 2.0, np.float32)  # a NumPy argument is put on the slice

    def stats(v: jax.Array, w: jax.Array, *, scale: float, label: str) -> dict[str, object]:
        assert isinstance(w, jax.Array) and label == "run"
        a = np.asarray(v) * scale + np.asarray(w)
        return {"scaled": a, "total": float(a.sum()), "rows": len(a)}

    out = {
        "scaled": jax.ShapeDtypeStruct((8, 4), np.float32, sharding=P("x")),
        "total": jax.ShapeDtypeStruct((), np.float32),
        "rows": jax.ShapeDtypeStruct((), np.int32),
    }
    got = pw.colocated(stats, out=out)(x, local, scale=3.0, label="run")
    assert got["scaled"].sharding.spec == P("x")
    assert got["total"].sharding.spec == P()
    want = value * 3.0 + 2.0
    np.testing.assert_array_equal(got["scaled"].fetch(), want)
    # Each device holds its rows of the declared sharding.
    shard = got["scaled"].addressable_shards[1]
    np.testing.assert_array_equal(np.asarray(shard.data), want[2:4])
    # Python numbers take the declared dtypes.
    assert got["total"].fetch() == np.float32(want.sum())
    assert got["rows"].dtype == np.int32 and int(got["rows"]) == 8


def test_out_may_follow_the_arguments(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.ones((8, 2), np.float32), P("x"))
    y = vs.put(np.ones((4,), np.float32), P())
    double = pw.colocated(lambda v: np.asarray(v) * 2, out=lambda v: v)
    a, b = double(x), double(y)
    assert a.shape == (8, 2) and a.sharding.spec == P("x")
    assert b.shape == (4,) and b.sharding.spec == P()
    np.testing.assert_array_equal(a.fetch(), 2 * np.ones((8, 2)))
    np.testing.assert_array_equal(b.fetch(), 2 * np.ones(4))


# State the next functions share with the tests: they are this module's, so they go
# to the hosts by reference, and the in-process hosts find this very module.
_RELEASE = threading.Event()
_STARTED = threading.Event()
_CALLS: list[int] = []


def _held(v: jax.Array) -> np.ndarray:
    _STARTED.set()
    if not _RELEASE.wait(30):
        raise TimeoutError("the test never let the function go")
    return np.asarray(v) + 1  # read after the donating launch was submitted


def _noted(v: jax.Array) -> np.ndarray:
    _CALLS.append(1)
    return np.asarray(v)


def test_it_takes_its_turn_on_the_island_so_a_donation_after_it_waits(
    vs: pw.VirtualSlice,
) -> None:
    x = vs.put(np.ones((8, 4), np.float32), P("x"))
    held = pw.colocated(_held, out=lambda v: v)
    bump = pw.jit(lambda v: v * 10, donate_argnums=0)
    # Each run once before: the function's second call is the one the host knows.
    _RELEASE.set()
    held(x).block_until_ready()
    bump(vs.put(np.ones((8, 4), np.float32), P("x"))).block_until_ready()
    _RELEASE.clear()
    _STARTED.clear()
    try:
        y = held(x)
        z = bump(x)  # donates x: it must wait for _held to have read it
        assert _STARTED.wait(30)
        time.sleep(0.2)
        # The island's next launch waits behind the running function...
        assert not z.is_ready() and not y.is_ready()
        # ...while its host still answers: a put there, and its fetch.
        w = vs.put(np.zeros(4, np.float32), P())
        np.testing.assert_array_equal(w.fetch(), np.zeros(4))
        # A new function's first call asks the host for the layouts its compile picks,
        # as jax.jit's first call compiles: answered now, not once the island is free.
        fresh = pw.jit(lambda v: v - 1.0)(w)
        assert not y.is_ready() and not fresh.is_ready()
    finally:
        _RELEASE.set()
    np.testing.assert_array_equal(y.fetch(), np.full((8, 4), 2.0))
    np.testing.assert_array_equal(z.fetch(), np.full((8, 4), 10.0))
    np.testing.assert_array_equal(fresh.fetch(), np.full(4, -1.0))


def test_jax_programs_inside_run_in_the_islands_order(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.arange(16, dtype=np.float32).reshape(8, 2), P("x"))
    step = pw.jit(lambda v: v + v.sum() * 1e-3)
    # A sum over the four devices (an all-reduce) run by the host's own JAX, between
    # the island's own all-reducing programs: all in one order, no collective deadlock.
    total = pw.colocated(lambda v: jnp.sum(v), out=_scalar)
    plain = jax.jit(lambda v: v + v.sum() * 1e-3)
    ref = np.arange(16, dtype=np.float32).reshape(8, 2)
    sums = []
    for _ in range(12):
        x = step(x)
        ref = np.asarray(plain(ref))
        sums.append((total(x), float(ref.sum())))
    for got, want in sums:
        assert float(got) == pytest.approx(want, rel=1e-5)


def test_a_failure_is_a_value_with_the_hosts_traceback(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.ones(4, np.float32), P())

    def broken(v: jax.Array) -> np.ndarray:
        raise ValueError(f"no good: {float(np.asarray(v).sum())}")

    y = pw.colocated(broken, out=lambda v: v)(x)
    z = pw.jit(lambda v: v * 2)(y)  # consumes the failed output
    for r in (y, z):
        with pytest.raises(pw.RemoteError) as info:
            r.fetch()
        assert "ValueError: no good: 4.0" in str(info.value)
        assert info.value.program == "broken" and info.value.host == vs.host
        assert "in broken" in info.value.remote_traceback
    # Not even sys.exit() in it ends the host's thread: the call fails, the host goes on.
    with pytest.raises(pw.RemoteError, match="raised SystemExit: 3"):
        pw.colocated(lambda v: sys.exit(3), out=lambda v: v)(x).fetch()
    ok = pw.colocated(lambda v: np.asarray(v) + 1, out=lambda v: v)(x)
    np.testing.assert_array_equal(ok.fetch(), np.full(4, 2.0))


@pytest.mark.parametrize(
    ("fn", "out", "says"),
    [
        (lambda v: np.zeros(3, np.float32), lambda v: v, "shape (3,) and dtype float32"),
        (lambda v: np.asarray(v, np.float64), lambda v: v, "dtype float64"),
        (lambda v: (np.asarray(v),), lambda v: v, "returned 1 array as PyTreeDef((*,))"),
        (lambda v: np.asarray(v), lambda v: (v, v), "declared 2 arrays"),
    ],
)
def test_a_return_other_than_declared_fails_the_call(
    vs: pw.VirtualSlice, fn: object, out: object, says: str
) -> None:
    x = vs.put(np.ones((8,), np.float32), P("x"))
    got = pw.colocated(fn, out=out)(x)  # type: ignore[arg-type]
    with pytest.raises(pw.RemoteError, match="declare what it returns in out=") as info:
        pw.fetch(got)
    assert says in str(info.value) and info.value.kind == "invalid"


def test_bad_declarations_and_calls_are_refused_at_once(
    client: pw.Client, vs: pw.VirtualSlice
) -> None:
    x = vs.put(np.ones((8,), np.float32), P("x"))
    with pytest.raises(TypeError, match="takes a function; got int"):
        pw.colocated(3, out=_scalar)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="declares no arrays"):
        pw.colocated(lambda v: None, out=None)(x)
    with pytest.raises(TypeError, match="something with a shape and a dtype"):
        pw.colocated(lambda v: v, out=lambda v: "float32")(x)
    with pytest.raises(ValueError, match="does not split evenly"):
        pw.colocated(lambda v: v, out=jax.ShapeDtypeStruct((6,), np.float32, sharding=P("x")))(x)
    with pytest.raises(TypeError, match="numeric arrays"):
        pw.colocated(lambda v: v, out=jax.ShapeDtypeStruct((), jax.random.key(0).dtype))(x)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="could not pickle"):
        pw.colocated(lambda v: (lock, v)[1], out=lambda v: v)(x)
    inner = pw.colocated(lambda v: v, out=lambda v: v)
    with pytest.raises(TypeError, match="not inside one being traced"):
        pw.jit(lambda v: inner(v))(x)
    other = client.allocate({"x": 2}, name="other")
    try:
        y = other.put(np.ones(2, np.float32), P())
        with pytest.raises(ValueError, match=r"pw.colocated\(f, out=..., slice=...\)"):
            pw.colocated(lambda a, b: a, out=lambda a, b: a)(x, y)
        # Pinned, the other slice's array moves to its host first.
        pinned = pw.colocated(
            lambda a, b: np.asarray(a)[:2] + np.asarray(b), out=lambda a, b: b, slice=other
        )
        r = pinned(x, y)
        assert r.slice is other
        np.testing.assert_array_equal(r.fetch(), np.full(2, 2.0))
    finally:
        other.release()


def test_one_program_per_function_and_other_values(
    cluster: pw.InProcessCluster, vs: pw.VirtualSlice
) -> None:
    x = vs.put(np.ones(4, np.float32), P())
    host = next(h for h in cluster.hosts if h.name == vs.host)
    scale = pw.colocated(lambda v, k: np.asarray(v) * k, out=lambda v, k: v)
    before = host.executor.programs.count
    for _ in range(3):
        np.testing.assert_array_equal(scale(x, 2.0).fetch(), np.full(4, 2.0))
    assert host.executor.programs.count == before + 1
    np.testing.assert_array_equal(scale(x, 3.0).fetch(), np.full(4, 3.0))  # another program
    assert host.executor.programs.count == before + 2
    # A value that cannot be hashed is pickled each call: the same bytes, the same program.
    sized = pw.colocated(lambda v, k: np.asarray(v) * len(k), out=lambda v, k: v)
    for _ in range(2):
        np.testing.assert_array_equal(sized(x, {"a", "b"}).fetch(), np.full(4, 2.0))
    assert host.executor.programs.count == before + 3


def test_the_graph_of_a_step_shows_it_without_running_it(
    client: pw.Client, vs: pw.VirtualSlice
) -> None:
    x = vs.put(np.ones((8, 2), np.float32), P("x"))
    _CALLS.clear()
    f = pw.colocated(_noted, out=lambda v: v)
    g = pw.jit(lambda v: v.sum(), name="total")
    graph = client.graph(lambda v: g(f(v)), x)
    assert list(graph.nodes.name) == ["input", "_noted", "total"]
    assert _CALLS == []
    with client.record() as rec:
        assert float(g(f(x))) == 16.0
    assert _CALLS == [1]
    assert list(rec.annotate().nodes.name) == ["input", "_noted", "total"]


def test_hosts_may_refuse_clients_python() -> None:
    with pw.InProcessCluster(1, 2, config=Config(colocated_python=False)) as c, c.client() as cl:
        vs = cl.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P())
        y = pw.colocated(lambda v: np.asarray(v), out=lambda v: v)(x)
        with pytest.raises(pw.RemoteError, match="PATHWAYS_COLOCATED_PYTHON=0") as info:
            y.fetch()
        assert info.value.kind == "invalid"
        # Its programs still run.
        assert float(pw.jit(lambda v: v.sum())(x)) == 2.0
