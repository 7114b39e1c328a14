"""Corners where a RemoteArray and pw.jit answer as a jax.Array and jax.jit do: values,
dtypes, weak types and errors, each beside plain JAX on the same inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


@pytest.fixture
def vs(client: pw.Client) -> pw.VirtualSlice:
    return client.allocate({"data": 4})


def test_big_endian_values_are_put_as_their_numbers(vs: pw.VirtualSlice) -> None:
    value = np.arange(8, dtype=">f4")
    x = vs.put(value, P("data"))
    assert x.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(x), np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(x + 1), np.arange(8) + 1)
    f = pw.jit(lambda a: a * 2, slice=vs)
    np.testing.assert_array_equal(np.asarray(f(np.arange(4, dtype=">i4"))), [0, 2, 4, 6])


def test_python_ints_beyond_int32_overflow_as_in_jax(vs: pw.VirtualSlice) -> None:
    with pytest.raises(OverflowError):
        jax.device_put(2**40)
    with pytest.raises(OverflowError, match=r"Python int 1099511627776 too large.*int32"):
        vs.put(2**40)
    with pytest.raises(OverflowError, match="2147483648"):
        vs.put([1, 2**31])
    x = vs.put(np.arange(4, dtype=np.int32), P("data"))
    add = pw.jit(lambda a, b: a + b)
    with pytest.raises(OverflowError):
        add(x, 2**31)
    np.testing.assert_array_equal(np.asarray(add(x, 2**31 - 4)), np.arange(4) + 2**31 - 4)
    # NumPy int64 arrays become int32 as jax.device_put makes them, without a word.
    assert vs.put(np.array([2**40])).dtype == np.int32


def test_every_float8_type_travels(vs: pw.VirtualSlice) -> None:
    values = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    for dtype in (ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz):
        x = vs.put(values.astype(dtype), P("data"))
        got = np.asarray(x)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got.astype(np.float32), values)
        back = np.asarray(vs.put(values, P("data")).astype(dtype))
        np.testing.assert_array_equal(back, np.asarray(jnp.asarray(values).astype(dtype)))


def test_signed_zeros_get_programs_of_their_own(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.ones(4, np.float32), P("data"))
    np.testing.assert_array_equal(np.signbit(np.asarray(x * -0.0)), True)
    np.testing.assert_array_equal(np.signbit(np.asarray(x * 0.0)), False)
    np.testing.assert_array_equal(np.asarray(1 / (x * 0.0)), np.inf)
    np.testing.assert_array_equal(np.asarray(x.at[0].set(-0.0)), [-0.0, 1, 1, 1])
    assert np.signbit(np.asarray(x.at[1].set(-0.0))[1])
    assert not np.signbit(np.asarray(x.at[1].set(0.0) * 1)[1])


def test_static_arguments_by_position_or_keyword_or_default(vs: pw.VirtualSlice) -> None:
    def scale(v: jax.Array, n: int = 2) -> jax.Array:
        return v * n

    def ones(v: jax.Array, n: int) -> jax.Array:
        return v + jnp.ones(n)  # n sets a shape: it must be static

    v = np.arange(4, dtype=np.float32)
    x = vs.put(v)
    by_num = pw.jit(scale, static_argnums=1)
    want = jax.jit(scale, static_argnums=1)
    for call in (lambda f, a: f(a, 3), lambda f, a: f(a, n=3), lambda f, a: f(a)):
        np.testing.assert_array_equal(np.asarray(call(by_num, x)), np.asarray(call(want, v)))
    by_name = pw.jit(ones, static_argnames="n")
    np.testing.assert_array_equal(np.asarray(by_name(x, 4)), np.arange(4) + 1)
    np.testing.assert_array_equal(np.asarray(by_name(x, n=4)), np.arange(4) + 1)
    assert by_num.static_argnames == ("n",) and by_name.static_argnums == (1,)
    with pytest.raises(ValueError, match="static_argnames names 'm'"):
        pw.jit(ones, static_argnames="m")


def test_results_keep_jaxs_weak_types(vs: pw.VirtualSlice) -> None:
    ints = np.arange(4, dtype=np.int32)
    halves = np.ones(4, ml_dtypes.bfloat16)
    x, h = vs.put(ints), vs.put(halves)
    pairs = [
        (x * 0.5, jnp.asarray(ints) * 0.5),
        (vs.put(2.0), jax.device_put(2.0)),
        (pw.jit(lambda a: a * 0 + 1.0)(x), jax.jit(lambda a: a * 0 + 1.0)(ints)),
        (vs.put(np.float32(2.0)), jax.device_put(np.float32(2.0))),
        (vs.put(True), jax.device_put(True)),
    ]
    for ours, theirs in pairs:
        assert ours.weak_type == theirs.weak_type, (ours, theirs)
        assert (ours * h).dtype == (theirs * jnp.asarray(halves)).dtype


def test_scalar_masks_complex_updates_and_apply_as_in_jax(vs: pw.VirtualSlice) -> None:
    v = np.arange(4, dtype=np.float32)
    x, j = vs.put(v), jnp.asarray(v)
    for flag in (True, False):
        mask = vs.put(np.bool_(flag))
        np.testing.assert_array_equal(np.asarray(x[mask]), np.asarray(j[jnp.bool_(flag)]))
        np.testing.assert_array_equal(
            np.asarray(x.at[mask].set(-1)), np.asarray(j.at[jnp.bool_(flag)].set(-1))
        )
    c = vs.put(np.zeros(2, np.complex64))
    np.testing.assert_array_equal(np.asarray(c.at[0].set(1j).at[1].add(2j)), [1j, 2j])
    np.testing.assert_allclose(np.asarray(x.at[1:3].apply(jnp.sin)), j.at[1:3].apply(jnp.sin))
    with pytest.raises(TypeError, match=r"at\[...\].apply takes a function"):
        x.at[0].apply(3)


def test_integer_powers_with_numpy_exponents_keep_the_base_dtype(vs: pw.VirtualSlice) -> None:
    base = np.array([2, 3], np.int8)
    x, j = vs.put(base), jnp.asarray(base)
    for exponent in (np.int64(5), np.int8(3), np.array(2, np.int32), jnp.int32(2)):
        got, want = x**exponent, j**exponent
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(TypeError, match="negative powers"):
        x ** np.int32(-1)


def test_masked_arrays_are_refused_as_jax_refuses_them(vs: pw.VirtualSlice) -> None:
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    with pytest.raises(ValueError, match="masked arrays"):
        jax.device_put(masked)
    with pytest.raises(ValueError, match=r"masked arrays.*value.filled"):
        vs.put(masked)


def test_remote_masks_must_cover_the_dimensions_they_index(vs: pw.VirtualSlice) -> None:
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x, j = vs.put(v), jnp.asarray(v)
    good = np.array([True, False, True, True])
    for bad in (np.ones(10, bool), np.ones(3, bool)):
        with pytest.raises(IndexError, match="boolean index did not match"):
            j[..., bad]
        with pytest.raises(
            IndexError, match=r"did not match.*index 1: got \(\d+,\), expected \(4,\)"
        ):
            x[..., vs.put(bad)]
        with pytest.raises(IndexError, match="did not match"):
            x.at[:, :, vs.put(bad)].set(-1)
    np.testing.assert_array_equal(np.asarray(x[..., vs.put(good)]), np.asarray(j[..., good]))
    np.testing.assert_array_equal(np.asarray(x[:, None, vs.put(good[:3])]), v[:, None, good[:3]])
    both = np.array([[True, False, True], [False, True, True]])
    np.testing.assert_array_equal(np.asarray(x[vs.put(both)]), v[both])
    np.testing.assert_array_equal(np.asarray(x.at[vs.put(both), 1:].set(0)), j.at[both, 1:].set(0))


def test_static_values_of_different_types_trace_programs_of_their_own(
    vs: pw.VirtualSlice,
) -> None:
    ints = np.arange(3, dtype=np.int32)
    ours = pw.jit(lambda a, k: a * k, static_argnums=1)
    theirs = jax.jit(lambda a, k: a * k, static_argnums=1)
    x = vs.put(ints)
    for k in (2, 2.0, True, 2.5):
        got, want = ours(x, k), theirs(ints, k)
        assert got.dtype == want.dtype, k
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_static_argnums_count_from_the_end_and_are_checked_as_in_jax(
    vs: pw.VirtualSlice,
) -> None:
    def repeat(a: jax.Array, k: int) -> jax.Array:
        return sum(a for _ in range(k))

    x = vs.put(np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(pw.jit(repeat, static_argnums=-1)(x, 3)), [0, 3, 6, 9])
    with pytest.raises(ValueError):
        jax.jit(repeat, static_argnums=5)
    with pytest.raises(ValueError, match=r"static_argnums=\(5,\) names position 5.*takes 2"):
        pw.jit(repeat, static_argnums=5)


def test_eval_shape_and_trace_type_python_numbers_weakly(vs: pw.VirtualSlice) -> None:
    f = pw.jit(lambda a, s: a * s, slice=vs)
    g = jax.jit(lambda a, s: a * s)
    for dtype, scalar in ((np.float16, 2.0), (np.int8, 2)):
        x = vs.put(np.ones(4, dtype))
        want = jax.eval_shape(g, jnp.ones(4, dtype), scalar).dtype
        assert want == dtype
        assert f.eval_shape(x, scalar).dtype == want
        assert f(x, scalar).dtype == want
        assert f.trace(x, scalar).out_info.dtype == want


def test_a_closed_clients_slices_read_released(cluster: pw.InProcessCluster) -> None:
    client = cluster.client()
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(2, np.float32))
    client.close()
    assert vs.state == "released" and "released" in repr(x)
    vs.release()  # a no-op, as releasing twice is
    # Each says the client was closed, not that the slice was released: allocating a
    # new slice, what the latter advises, cannot work on a closed client.
    for use in (lambda: vs.put(np.ones(2)), vs.wait_active, vs.check_active):
        with pytest.raises(pw.ClosedError, match="this client was closed"):
            use()
    # Its arrays, given to another client, say the same.
    with cluster.client() as other:
        there = other.allocate({"data": 2})
        for use in (lambda: there.put(x), lambda: pw.jit(lambda v: v, slice=there)(x)):
            with pytest.raises(pw.ClosedError, match="belongs to a client that was closed"):
                use()


def test_typed_keys_count_their_bytes_as_jax_does(vs: pw.VirtualSlice) -> None:
    keys = jax.random.split(jax.random.key(0), 3)
    put = vs.put(keys)
    assert (put.nbytes, put.itemsize) == (keys.nbytes, keys.dtype.itemsize) == (24, 8)


def test_a_slice_with_explicit_axes_traces_shardings_in_types_as_jax_does(
    client: pw.Client,
) -> None:
    """As under ``jax.make_mesh``'s default axis types: shardings are part of the types
    the function sees, and the results match plain JAX on a mesh of the same types."""
    vs = client.allocate({"data": 2}, axis_types="explicit")
    auto = client.allocate({"data": 2})
    assert "axis_types=['explicit']" in repr(vs)
    seen: list[str] = []

    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        seen.append(str(jax.typeof(a @ b)))
        return jax.sharding.reshard(a @ b, P())

    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    b = np.ones((2, 3), np.float32)
    got = pw.jit(f)(vs.put(a, P("data")), vs.put(b, P()))
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
    with jax.set_mesh(mesh):
        want = jax.jit(f)(jax.device_put(a, P("data")), jax.device_put(b, P()))
    assert seen == ["float32[4@data,3]", "float32[4@data,3]"]
    np.testing.assert_array_equal(got.fetch(), np.asarray(want))
    assert got.sharding.mesh.axis_types == mesh.axis_types and got.spec == P()
    # A requested in_sharding other than the array's own is a reshard there.
    resharded = pw.jit(lambda v: v * 1, in_shardings=P())(vs.put(a, P("data")))
    np.testing.assert_array_equal(resharded.fetch(), a)
    # Arrays move between slices of either kind, and programs take them.
    moved = pw.jit(lambda x: x * 2, slice=auto)(got)
    back = pw.jit(lambda x: x + 1, slice=vs)(moved)
    np.testing.assert_array_equal(back.fetch(), np.asarray(want) * 2 + 1)
    with pytest.raises(ValueError, match=r"one type per mesh axis \(1: \['data'\]\)"):
        client.allocate({"data": 2}, axis_types=("explicit", "auto"))
    with pytest.raises(ValueError, match="or their names: 'auto', 'explicit', 'manual'"):
        client.allocate({"data": 2}, axis_types="sideways")
    # The status tables show each slice's axis types, every tenant's.
    types = client.status().slices.set_index("slice")["axis_types"]
    assert types[vs.id] == "Explicit" and types[auto.id] == "Auto"
    two = client.allocate({"a": 1, "b": 2}, axis_types=("explicit", "auto"))
    assert client.status().slices.set_index("slice")["axis_types"][two.id] == "Explicit, Auto"
    # The controller checks what a hand-made allocate names.
    for types_, why in ((["Sideways"], "axis types among"), (["Auto"] * 2, "one type per mesh")):
        with pytest.raises((TypeError, ValueError), match=why):
            client._ask({"t": "allocate", "mesh": [["x", 2]], "name": None, "axis_types": types_})
    two.release()
    vs.release()
    auto.release()
