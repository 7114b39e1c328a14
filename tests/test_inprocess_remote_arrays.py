"""Remote arrays answer what jax.Arrays answer, with the same numbers."""

from __future__ import annotations

import asyncio
import copy
import functools
import io
import operator
import pickle
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


def test_remote_array_arithmetic_and_indexing(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    a_np = np.arange(12, dtype=np.float32).reshape(4, 3)
    a = vs.put(a_np, P("data"))
    b = vs.put(np.full((4, 3), 2.0, np.float32), P("data"))
    np.testing.assert_array_equal(np.asarray(a + b), a_np + 2)
    np.testing.assert_array_equal(np.asarray(a * 0.5), a_np * 0.5)
    np.testing.assert_array_equal(np.asarray(1 - a), 1 - a_np)
    np.testing.assert_array_equal(np.asarray(-a), -a_np)
    np.testing.assert_array_equal(np.asarray(a[1]), a_np[1])
    np.testing.assert_array_equal(np.asarray(a[:, 1:]), a_np[:, 1:])
    np.testing.assert_array_equal(np.asarray(a.T), a_np.T)
    np.testing.assert_array_equal(np.asarray(a.sum(0)), a_np.sum(0))
    np.testing.assert_array_equal(np.asarray(a @ a.T), a_np @ a_np.T)
    assert float(a.mean()) == pytest.approx(a_np.mean())
    assert (a > 5).fetch().tolist() == (a_np > 5).tolist()


def test_python_numbers_are_weakly_typed_arguments_as_in_jax_jit(client: pw.Client) -> None:
    """A Python number passed to a program takes the dtype of the arrays it meets (a
    float16 array times 2.0 stays float16), and a new value runs the same program."""
    vs = client.allocate({"data": 2})

    @pw.jit
    def scale(t: jax.Array, s: Any) -> jax.Array:
        return t * s

    cases = [(np.ones(4, np.float16), 2.5), (np.ones(4, np.int8), 3), (np.ones(4, np.float32), 2)]
    for value, number in cases:
        got = scale(vs.put(value, P("data")), number)
        want = jax.jit(lambda t, s: t * s)(value, number)
        assert got.dtype == want.dtype, (value.dtype, number)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    x = vs.put(np.ones(4, np.float16), P("data"))
    programs = len(scale._programs)
    for lr in (0.1, 0.01, 0.001):
        np.testing.assert_allclose(np.asarray(scale(x, lr)), np.float16(lr), rtol=1e-3)
    assert len(scale._programs) == programs  # one program for every value of lr


def test_remote_arrays_answer_what_jax_arrays_do(client: pw.Client) -> None:
    """Methods, ``.at`` updates, ``==``, array indices and iteration give what the same
    expression gives on a jax.Array, each run as a small program on the slice."""
    vs = client.allocate({"data": 2})
    v = np.arange(24, dtype=np.float32).reshape(4, 6) - 7.0
    x, j = vs.put(v, P("data")), jnp.asarray(v)
    r = vs.put(np.array([3, 0], np.int32))  # a remote index
    cases: dict[str, Any] = {
        "max(axis=1)": lambda t: t.max(axis=1),
        "min": lambda t: t.min(),
        "argmax(0)": lambda t: t.argmax(0),
        "std(ddof=1)": lambda t: t.std(ddof=1),
        "var(axis=0, keepdims=True)": lambda t: t.var(axis=0, keepdims=True),
        "ravel": lambda t: t.ravel(),
        "transpose(1, 0)": lambda t: t.transpose(1, 0),
        "clip(-2, 5)": lambda t: t.clip(-2, 5),
        "cumsum(axis=1)": lambda t: t.cumsum(axis=1),
        "reshape(2, 12)": lambda t: t.reshape(2, 12),
        "reshape(-1, 3, order='F')": lambda t: t.reshape(-1, 3, order="F"),
        "sum(dtype=int32)": lambda t: t.sum(dtype=jnp.int32),
        "mean(dtype=np.float32)": lambda t: t.mean(dtype=np.float32),
        "[None].squeeze(0)": lambda t: t[None].squeeze(0),
        "mT": lambda t: t.mT,
        "copy": lambda t: t.copy(),
        "view(int32)": lambda t: t.view(jnp.int32),
        "ptp(axis=0)": lambda t: t.ptp(axis=0),
        "ravel().searchsorted(2.5)": lambda t: t.ravel().searchsorted(2.5),
        "[:, 0].argpartition(2)": lambda t: t[:, 0].argpartition(2),
        "conjugate": lambda t: t.conjugate(),
        "== 1": lambda t: t == 1,
        "!= x": lambda t: t != t[0],
        "[[2, 0]]": lambda t: t[np.array([2, 0])],
        "[mask]": lambda t: t[np.array([True, False, False, True])],
        "[:, mask]": lambda t: t[:, v[0] > -5],
        "at[1, 2].set(9)": lambda t: t.at[1, 2].set(9.0),
        "at[[0, 3]].add(np)": lambda t: t.at[np.array([0, 3])].add(np.ones(6, np.float32)),
        "at[:, 0].multiply(t[:, 1])": lambda t: t.at[:, 0].multiply(t[:, 1]),
        "at[mask].set(0)": lambda t: t.at[v > 0].set(0.0),
        # None is an index too (a new axis): it was taken for "no index" at all.
        "at[None].set(7)": lambda t: t.at[None].set(7.0),
        "at[None, 1].add(1)": lambda t: t.at[None, 1].add(1.0),
        # A mask that is itself an array on the slice: read, as a concrete jax.Array
        # mask is, and applied where it is true.
        "[t > 3]": lambda t: t[t > 3],
        "[:, t[0] > -5]": lambda t: t[:, t[0] > -5],
        "[t > 99]": lambda t: t[t > 99],
        "at[t > 0].set(0)": lambda t: t.at[t > 0].set(0.0),
        "clone": lambda t: t.clone(),
        "compress(mask, axis=0)": lambda t: t.compress(np.array([True, False, True]), axis=0),
        "compress(mask)": lambda t: t.compress(v.ravel() > 0),
        "compress(mask, axis=-1)": lambda t: t.compress(np.array([True, False, True]), axis=-1),
        "[:, 0].astype(int32).choose(clip)": lambda t: (
            (t[:, 0] > 0).astype(jnp.int32).choose([np.arange(4.0), -np.arange(4.0)], mode="clip")
        ),
        # Arrays inside a sequence argument are the program's inputs, as the array is.
        "[:, 0].astype(int32).choose([t[:, 1], t[:, 2]])": lambda t: (
            (t[:, 0] > 0).astype(jnp.int32).choose([t[:, 1], t[:, 2]], mode="clip")
        ),
    }
    for name, fn in cases.items():
        got, want = fn(x), fn(j)
        assert isinstance(got, pw.RemoteArray), name
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, err_msg=name)
    # An index that lives on the slice travels as an argument: one program for all values.
    np.testing.assert_array_equal(np.asarray(x[r]), v[[3, 0]])
    np.testing.assert_array_equal(
        np.asarray(x.at[r].set(x[r] * 2)),
        np.asarray(j.at[jnp.array([3, 0])].set(j[jnp.array([3, 0])] * 2)),
    )
    # Results whose shape depends on the values read them first, as a concrete
    # jax.Array does; with size= they need not.
    for got, want in ((x.nonzero(), j.nonzero()), (x.nonzero(size=30), j.nonzero(size=30))):
        assert len(got) == len(want) == 2
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert (float(v[1, 2]) in x[1], 1e9 in x[1]) == (float(v[1, 2]) in j[1], 1e9 in j[1])
    assert float(v[1, 2]) in x[1]
    with pytest.raises(ValueError, match="search array must be one-dimensional"):
        _ = 1.0 in x
    for t, u, axis in ((x, j, 2), (x, j, -3), (x.sum(), j.sum(), 0)):
        with pytest.raises(ValueError):
            u.compress(np.array([True]), axis=axis)
        with pytest.raises(ValueError, match=f"compress: axis {axis} is out of bounds"):
            t.compress(np.array([True]), axis=axis)
    # What jax.Array refuses with a TypeError, a RemoteArray refuses alike.
    with pytest.raises(TypeError):
        j.compress([True, False, True], axis=0)
    with pytest.raises(TypeError, match=r"condition must be an array.*np.asarray\(condition\)"):
        x.compress([True, False, True], axis=0)
    for bad in ([1.0], None, "a"):
        with pytest.raises(TypeError):
            _ = bad in j[1]
        with pytest.raises(TypeError, match="takes an array or a scalar"):
            _ = bad in x[1]
    with pytest.raises(TypeError, match=r"immutable.*x.at\[idx\].set\(y\)"):
        x[0, 0] = 1.0
    rows = list(x)
    assert len(rows) == 4 and all(row.shape == (6,) for row in rows)
    np.testing.assert_array_equal(np.stack([np.asarray(row) for row in rows]), v)
    with pytest.raises(TypeError, match="0-d"):
        iter(x.sum())
    # Python's operators that make arrays: round, divmod and shifts, reflected ones too.
    k, jk = vs.put(np.arange(8, dtype=np.int32) - 3, P("data")), jnp.arange(8, dtype=jnp.int32) - 3
    python_ops: dict[str, Any] = {
        "round(t)": lambda t: round(t * 1.5),
        "round(t, 2)": lambda t: round(t * 1.2345, 2),
        "divmod(t, 3)": lambda t: divmod(t, 3),
        "divmod(7, t)": lambda t: divmod(7, t + 20),
        "t << 2": lambda t: t << 2,
        "1 << t": lambda t: 1 << (t + 3),
        "t >> 1": lambda t: t >> 1,
        "64 >> t": lambda t: 64 >> (t + 3),
    }
    for name, fn in python_ops.items():
        got, want = jax.tree.leaves(fn(k)), jax.tree.leaves(fn(jk))
        assert len(got) == len(want) and all(isinstance(g, pw.RemoteArray) for g in got), name
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype, name
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, err_msg=name)
    # DLPack, as from a jax.Array on a CPU device: the fetched value, read-only where the
    # consumer can be told so and copied where it cannot (DLPack before 1.0).
    assert x.__dlpack_device__() == tuple(int(d) for d in j.__dlpack_device__())
    np.testing.assert_array_equal(np.from_dlpack(x), np.from_dlpack(j))
    assert not np.from_dlpack(x).flags.writeable
    assert np.from_dlpack(x, copy=True).flags.writeable
    np.testing.assert_array_equal(np.from_dlpack(_LegacyDLPack(x)), v)
    with pytest.raises(BufferError, match="no DLPack form"):
        np.from_dlpack(vs.put(jax.random.key(0)))
    assert x in {x} and x is not x.T  # hashed by identity, as the handle it is
    with pytest.raises(TypeError, match="index takes"):
        x[{"a": 1}]
    with pytest.raises(TypeError, match="non-tuple sequence"):  # as jax.Array says
        x[[1, 1, 3]]
    # Python scalars from one-element arrays; anything else refused as jax.Array refuses it.
    n = vs.put(np.int32(3))
    assert list(range(n)) == [0, 1, 2] and int(n) == 3 and float(x[0, 1]) == v[0, 1]
    assert complex(x[1, 1]) == complex(v[1, 1]) and bool(x[1, 1] > 0) == bool(v[1, 1] > 0)
    for convert in (int, float, complex, operator.index):
        with pytest.raises(TypeError, match="Only"):
            convert(x)
    with pytest.raises(TypeError, match="integer scalar"):
        operator.index(x[0, 0])
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x)
    assert x.tolist() == j.tolist() and x.sum().tolist() == j.sum().tolist()
    assert f"{x.sum():.3f}" == f"{j.sum():.3f}" and f"{x[1, 2]:+.1e}" == f"{j[1, 2]:+.1e}"
    with pytest.raises(TypeError, match="format"):  # as a jax.Array refuses it
        f"{x:.3f}"
    # str and f"{x}" give the value, as for a jax.Array; the repr never waits for it.
    assert str(x) == f"{x}" == str(j) and str(x.sum()) == str(j.sum())
    assert print_of(x[0, 1]) == print_of(j[0, 1])
    assert repr(x).startswith("RemoteArray(shape=(4, 6), dtype=float32")
    # Not for arrays too large to fetch on the way, nor failed or deleted ones: text that
    # other code formats (error messages) must neither move them nor raise.
    big = vs.put(np.zeros((1024, 257), np.float32), P("data"))
    assert str(big) == repr(big) and str(big).startswith("RemoteArray(shape=(1024, 257)")
    client.inject_fault(vs, match="doomed")
    doomed = pw.jit(lambda t: t + 1, name="doomed")(x)
    assert str(doomed) == repr(doomed) and "failed" in str(doomed)
    gone = x + 1
    gone.delete()
    assert "deleted" in str(gone)


class _LegacyDLPack:
    """A producer seen by a consumer of DLPack before 1.0, which passes no max_version."""

    def __init__(self, x: pw.RemoteArray) -> None:
        self._x = x

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._x.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._x.__dlpack_device__()


def test_devices_and_shards_are_those_of_the_same_jax_array(client: pw.Client) -> None:
    """``devices()`` and ``addressable_shards`` name the same parts, replica ids and
    device order as a ``jax.Array`` of the same sharding on a mesh of the same shape;
    each shard's ``data`` is that part of the value."""
    from jax.sharding import Mesh, NamedSharding

    vs = client.allocate({"a": 2, "b": 2})
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    order = {d: i for i, d in enumerate(mesh.devices.flat)}
    x = np.arange(48, dtype=np.float32).reshape(8, 6)
    for spec in (P(), P("a"), P(None, "b"), P("a", "b"), P(("b", "a")), P("b", None)):
        r = vs.put(x, spec)
        ref = jax.device_put(x, NamedSharding(mesh, spec))
        want = sorted((order[s.device], s.index, s.replica_id) for s in ref.addressable_shards)
        got = [(s.device.id, s.index, s.replica_id) for s in r.addressable_shards]
        assert got == want, spec
        assert [s.index for s in r.global_shards] == [i for _, i, _ in got]
        for s in r.addressable_shards[:2]:
            np.testing.assert_array_equal(s.data, x[s.index])
        assert "RemoteShard(device=VirtualDevice(id=0" in repr(r.addressable_shards[0])
    devices = r.devices()
    assert {d.id for d in devices} == {0, 1, 2, 3} and r.is_fully_addressable
    assert {d.device_id for d in devices} == set(vs.devices)
    assert all(d.host == vs.host and d.slice == vs.name for d in devices)
    assert vs.virtual_devices[2].device_id == vs.devices[2]
    np.testing.assert_array_equal(r.addressable_data(3), x[r.addressable_shards[3].index])

    # to_device, as the Array API's: another slice keeps the spec; a sharding of the
    # slice's own mesh lays it out anew; anything else says what it takes.
    other = client.allocate({"a": 2, "b": 2})
    moved = r.to_device(other)
    assert moved.slice is other and moved.spec == r.spec
    np.testing.assert_array_equal(moved.fetch(), x)
    relaid = r.to_device(vs.sharding(P("a")))
    assert relaid.slice is vs and relaid.spec == P("a")
    np.testing.assert_array_equal(relaid.fetch(), x)
    with pytest.raises(TypeError, match="VirtualSlice, or a NamedSharding"):
        r.to_device(jax.devices()[0])
    other.release()
    named = client.allocate({"x": 4})
    with pytest.raises(ValueError, match=r"has axes \['x'\]: .* such as vs.put\(x, P\(\)\)"):
        r.to_device(named)
    np.testing.assert_array_equal(named.put(r, P()).fetch(), x)  # as the message says
    named.release()
    with pytest.raises(NotImplementedError, match="flatten"):
        _ = r.flat
    np.testing.assert_array_equal(r.byteswap().fetch(), x.byteswap())


def test_remote_array_metadata_copies_and_pickling(client: pw.Client) -> None:
    """``itemsize``, ``aval`` and ``is_fully_replicated`` read as on a jax.Array without
    running anything; ``copy.copy``/``copy.deepcopy`` make new arrays on the slice (a
    snapshot of a parameter tree stays remote); pickling is refused, saying what to
    pickle instead."""
    vs = client.allocate({"data": 2, "model": 1})
    v = np.arange(8, dtype=np.float16).reshape(4, 2)
    x, j = vs.put(v, P("data")), jnp.asarray(v)
    assert (x.itemsize, x.aval, x.nbytes) == (j.itemsize, j.aval, j.nbytes)
    assert not x.is_fully_replicated
    assert vs.put(v, P()).is_fully_replicated and vs.put(v, P("model")).is_fully_replicated
    assert x.tobytes() == j.tobytes()
    # Where a jax.Array on the same mesh answers without running anything, so does x.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "model"))
    for spec in (P("data"), P(), P(None, "data")):
        on_mesh = jax.device_put(v, jax.sharding.NamedSharding(mesh, spec))
        mine = vs.put(v, spec)
        assert mine.on_device_size_in_bytes() == on_mesh.on_device_size_in_bytes(), spec
        assert mine.committed and on_mesh.committed
        assert mine.device == mine.sharding and mine.device.spec == on_mesh.device.spec
    params = {"w": [x], "b": vs.put(np.ones(2, np.float32), P())}
    snap = copy.deepcopy(params)
    assert snap["w"][0] is not x and snap["w"][0].handle != x.handle
    assert snap["w"][0].slice is vs and snap["w"][0].spec == x.spec
    np.testing.assert_array_equal(np.asarray(snap["w"][0]), v)
    shallow = copy.copy(x)
    assert shallow is not x and np.array_equal(np.asarray(shallow), v)
    x.delete()  # the copies are arrays of their own
    np.testing.assert_array_equal(np.asarray(snap["w"][0]), v)
    with pytest.raises(TypeError, match=r"cannot be pickled.*np.asarray\(x\)"):
        pickle.dumps(params)
    # A Dask task capturing the slice or the client is told what to do instead, where
    # pickle itself failed on the client's lock.
    with pytest.raises(TypeError, match=r"VirtualSlice cannot be pickled.*vs.put\(dask_array"):
        pickle.dumps({"vs": vs})
    with pytest.raises(TypeError, match=r"pw.Client cannot be pickled.*a client of its own"):
        pickle.dumps(client)


def print_of(value: Any) -> str:
    out = io.StringIO()
    print(value, file=out)
    return out.getvalue()


def test_await_gives_the_value_without_blocking_the_event_loop(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    v = np.arange(8, dtype=np.float32)
    x = vs.put(v, P("data"))
    client.inject_fault(vs, match="fails_awaited")
    # The slow program's value is 0.2 s on its way however fast the machine is, so the
    # loop's turns meanwhile are counted on state, not on timing.
    client.inject_fault(vs, match="slow_awaited", kind="delay:0.2")
    bad = pw.jit(lambda t: t + 1, name="fails_awaited")(x)

    async def main() -> tuple[Any, Any, int]:
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        # A slow program: the loop keeps turning while it runs and its value arrives.
        slow = pw.jit(
            lambda t: functools.reduce(lambda a, _: jnp.sin(a) + t, range(200), t),
            name="slow_awaited",
        )
        total, y = await asyncio.gather((x * 2).sum(), slow(x))
        with pytest.raises(pw.RemoteError, match="injected fault"):
            await bad
        other.cancel()
        return total, y, turns

    total, y, turns = asyncio.run(main())
    assert float(total) == float((v * 2).sum())
    want = jax.jit(lambda t: functools.reduce(lambda a, _: jnp.sin(a) + t, range(200), t))(v)
    np.testing.assert_allclose(y, np.asarray(want), rtol=1e-6)
    assert turns > 50  # the loop turned while the values were on their way


def test_copy_to_host_async_fetches_in_the_background(client: pw.Client) -> None:
    """As on a jax.Array: metrics asked for early are read later without a round trip
    then; a failure arrives with the value it replaces."""
    vs = client.allocate({"data": 2})
    v = np.arange(8, dtype=np.float32)
    x = vs.put(v, P("data"))
    metrics = {"loss": (x * 2).sum(), "x": x + 1}
    jax.tree.map(lambda m: m.copy_to_host_async(), metrics)
    held = {k: m._host for k, m in metrics.items()}
    assert all(f is not None for f in held.values())
    metrics["loss"].copy_to_host_async()  # again: the same request
    assert metrics["loss"]._host is held["loss"]
    got = pw.fetch(metrics)
    assert float(got["loss"]) == float((v * 2).sum()) and float(metrics["loss"]) == 56.0
    np.testing.assert_array_equal(got["x"], v + 1)
    assert all(f.done() for f in held.values())
    client.inject_fault(vs, match="fails_later")
    bad = pw.jit(lambda t: t + 1, name="fails_later")(x)
    bad.copy_to_host_async()
    with pytest.raises(pw.RemoteError, match="injected fault"):
        np.asarray(bad)
    gone = x * 3
    gone.copy_to_host_async()
    gone.delete()
    with pytest.raises(pw.ClosedError, match="deleted"):
        gone.fetch()


def test_the_background_fetch_thread_ends_with_its_client(cluster: pw.InProcessCluster) -> None:
    with cluster.client() as other:
        vs = other.allocate({"data": 2})
        x, y = vs.put(np.ones(4, np.float32), P("data")), vs.put(np.zeros(4, np.float32))
        x.copy_to_host_async()
        np.testing.assert_array_equal(np.asarray(x), np.ones(4))
        assert any(t.name.startswith("pathways-prefetch") for t in threading.enumerate())
    assert not any(t.name.startswith("pathways-prefetch") for t in threading.enumerate())
    with pytest.raises(pw.ClosedError, match="closed"):
        y.copy_to_host_async()


def test_typed_prng_keys_survive_put_and_fetch(client: pw.Client) -> None:
    vs = client.allocate({"x": 2})
    key = jax.random.key(42)
    k = vs.put(key)
    back = k.fetch()
    assert jax.dtypes.issubdtype(back.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(key))
    sample = pw.jit(lambda k: jax.random.normal(k, (4,)))(k)
    np.testing.assert_allclose(sample.fetch(), jax.random.normal(key, (4,)), rtol=1e-6)
    split = pw.jit(lambda k: jax.random.split(k, 3))(k)
    np.testing.assert_array_equal(
        jax.random.key_data(split.fetch()), jax.random.key_data(jax.random.split(key, 3))
    )


def test_float0_outputs_come_back_as_numpy_float0_arrays_as_from_jax_jit(
    client: pw.Client,
) -> None:
    """The gradient of an integer input is a float0 that holds no values: jax.jit
    returns it as a NumPy array, and so does pw.jit, while the host runs the rest. A
    program returning one once ended the host's threads."""
    vs = client.allocate({"x": 2})
    params = {"w": np.arange(4, dtype=np.float32), "n": np.int32(3)}
    grad = jax.grad(lambda p: (p["w"] * p["n"]).sum(), allow_int=True)
    want = jax.jit(grad)(params)
    got = pw.jit(grad)(vs.put(params))
    assert isinstance(got["w"], pw.RemoteArray) and isinstance(got["n"], np.ndarray)
    assert got["n"].dtype == want["n"].dtype == jax.dtypes.float0
    assert got["n"].shape == want["n"].shape
    np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(want["w"]))
    only = pw.jit(jax.grad(lambda n: n * 2.0, allow_int=True))(vs.put(np.int32(3)))
    assert isinstance(only, np.ndarray) and only.dtype == jax.dtypes.float0
    with pytest.raises(TypeError, match="put does not take float0 arrays"):
        vs.put(got["n"])
    np.testing.assert_array_equal(np.asarray(got["w"] + 1), np.asarray(want["w"]) + 1)


def test_jax_outside_pw_jit_refuses_a_remote_array_without_fetching_it() -> None:
    """jax.jit(f)(x) for pw.jit(f)(x) is the likely slip: JAX's own error for a type it
    does not know formats the value (a fetch) and suggests static arguments."""
    with pw.InProcessCluster(1, 2) as cluster:
        client = cluster.client()
        vs = client.allocate({"data": 2})
        x = vs.put(np.arange(4, dtype=np.float32), P("data"))
        client.inject_fault(vs, match="slow", kind="delay:5")
        y = pw.jit(lambda v: v * 2, name="slow")(x)
        calls = {
            "jax.jit": lambda: jax.jit(lambda v: v + 1)(y),
            "jnp.sin": lambda: jnp.sin(y),
            "jax.device_put": lambda: jax.device_put(y),
        }
        for what, call in calls.items():
            with pytest.raises(ValueError) as info:
                call()
            message = str(info.value)
            assert message.startswith(
                "a pathways_nb RemoteArray (shape (4,), float32) lives on slice 's1' of the "
                "cluster, not in this process"
            ), what
            assert "pw.jit(f)(x) where you wrote jax.jit(f)(x)" in message
        assert not y.is_ready()  # nothing waited for its value
        # What the message offers works.
        here = jnp.sin(jnp.asarray(y.fetch()))
        np.testing.assert_array_equal(pw.jit(jnp.sin)(y).fetch(), here)
        np.testing.assert_array_equal(here, jnp.sin(jnp.arange(4.0, dtype=jnp.float32) * 2))


def test_item_takes_an_index_as_jax_arrays_do(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    x, want = vs.put(a, P("data")), jnp.asarray(a)
    for args in [(5,), (-1,), ((3, 1),), (3, 1), ((-1, -2),)]:
        assert x.item(*args) == want.item(*args), args
    # Out of bounds is NumPy's IndexError (indexing on the slice would clamp).
    with pytest.raises(IndexError, match="index 8 is out of bounds"):
        x.item(8)
    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        x.item((4, 0))
    with pytest.raises(ValueError, match=r"item takes 2 indices for shape \(4, 2\)"):
        x.item((1,))
    assert vs.put(np.float32(3)).item() == 3.0
    vs.release()
