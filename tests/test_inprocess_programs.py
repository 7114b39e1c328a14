"""Programs on an in-process cluster give the numbers plain JAX gives."""

from __future__ import annotations

import _thread
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
import optax
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.deploy._demo import init_params, loss_fn, make_data, train_step


def test_put_fetch_roundtrip_dtypes_and_specs(client: pw.Client) -> None:
    vs = client.allocate({"data": 4})
    rng = np.random.default_rng(0)
    cases = [
        (rng.standard_normal((8, 3)).astype(np.float32), P("data")),
        (rng.integers(-5, 5, (4, 8)).astype(np.int32), P(None, "data")),
        (np.arange(6, dtype=np.uint8).reshape(2, 3), P()),
        (np.array(3.5, np.float32), P()),
        (rng.standard_normal((4,)).astype(np.float16), P("data")),
        (np.array([True, False, True, True]), P("data")),
    ]
    remotes = [vs.put(a, spec) for a, spec in cases]
    for (a, spec), r in zip(cases, remotes, strict=True):
        assert r.shape == a.shape and np.dtype(r.dtype) == a.dtype and r.spec == spec
        out = r.fetch()
        assert out.dtype == a.dtype and out.shape == a.shape
        np.testing.assert_array_equal(out, a)
    tree = pw.fetch({"a": remotes[0], "b": [remotes[3], 7]})
    np.testing.assert_array_equal(tree["a"], cases[0][0])
    assert tree["b"][1] == 7 and float(tree["b"][0]) == 3.5


def test_put_takes_pytrees_with_one_spec_or_a_tree_of_them(client: pw.Client) -> None:
    """As jax.device_put does: a dict (or another pytree node) of arrays comes back as
    the same tree of RemoteArrays; a list of numbers and arrays stays one array-like, as
    np.asarray reads it, and a list or tuple holding containers is a pytree."""
    vs = client.allocate({"data": 2})
    w, b = np.arange(8.0, dtype=np.float32).reshape(4, 2), np.ones(2, np.float32)
    params = vs.put({"w": w, "b": b, "none": None}, {"w": P("data"), "b": P(), "none": None})
    assert params["w"].spec == P("data") and params["b"].spec == P() and params["none"] is None
    got = pw.fetch(params)
    np.testing.assert_array_equal(got["w"], w)
    np.testing.assert_array_equal(got["b"], b)
    step = pw.jit(lambda p, x: x @ p["w"] + p["b"])
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(np.asarray(step(params, x)), x @ w + b)
    pair = jax.tree_util.register_pytree_node_class  # a registered node, not a dict

    @pair
    class Pair:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

        def tree_flatten(self) -> tuple[tuple[Any, Any], None]:
            return (self.a, self.b), None

        @classmethod
        def tree_unflatten(cls, aux: None, children: Any) -> Pair:
            return cls(*children)

    both = vs.put(Pair(w, b), P())
    assert isinstance(both, Pair) and both.a.spec == P() and both.b.shape == (2,)
    assert vs.put([1.0, 2.0], P("data")).shape == (2,)
    assert vs.put([w, w]).shape == (2, 4, 2)  # arrays in a list stack, as np.asarray's
    # A tuple or list holding containers is a pytree: an optimizer state, a model's layers.
    state = optax.adam(1e-2).init({"w": w, "b": b})
    remote = vs.put(state)
    assert jax.tree.structure(remote) == jax.tree.structure(state)
    for want, have in zip(jax.tree.leaves(state), pw.fetch(jax.tree.leaves(remote)), strict=True):
        np.testing.assert_array_equal(have, np.asarray(want))
    layers = vs.put([{"w": w}, {"w": 2 * w}])
    assert isinstance(layers, list) and np.array_equal(layers[1]["w"].fetch(), 2 * w)
    with pytest.raises(ValueError, match="pytree of them matching"):
        vs.put({"w": w}, {"w": P("data"), "extra": P()})
    with pytest.raises(TypeError, match="PartitionSpec"):
        vs.put({"w": w}, "data")
    vs.release()


def test_fetch_of_partly_replicated_layouts_on_a_2d_mesh(client: pw.Client) -> None:
    # Devices that hold the same region must not count twice, and regions that tile two
    # dimensions must land in place.
    vs = client.allocate({"a": 2, "b": 2})
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for spec in (P("a"), P(None, "b"), P("a", "b"), P(("a", "b")), P()):
        np.testing.assert_array_equal(vs.put(x, spec).fetch(), x)
    doubled = pw.jit(lambda v: v * 2, slice=vs, out_shardings=P("b", "a"))(vs.put(x, P("a")))
    np.testing.assert_array_equal(np.asarray(doubled), x * 2)
    vs.release()


def test_64_bit_inputs_follow_jax_default_dtypes(client: pw.Client) -> None:
    """Without x64, a put narrows 64-bit types as jax.device_put does, and the remote
    array says so before anything ran."""
    vs = client.allocate({"data": 2})
    for value in (np.arange(4.0), np.arange(4), np.arange(4, dtype=np.uint64), np.arange(4) * 1j):
        want = jax.device_put(value)
        x = vs.put(value, P("data"))
        assert np.dtype(x.dtype) == want.dtype, value.dtype
        got = x.fetch()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, np.asarray(want))


def test_put_refuses_what_no_program_could_take(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    with pytest.raises(TypeError, match=r"sub-byte dtypes such as int4.*as int8"):
        vs.put(np.arange(4).astype(jnp.int4), P("data"))
    with pytest.raises(TypeError, match="numeric or boolean arrays"):
        vs.put(np.array(["a", "b"]), P())


def test_sharded_program_matches_plain_jax(client: pw.Client) -> None:
    vs = client.allocate({"data": 4})
    rng = np.random.default_rng(1)
    w_np = rng.standard_normal((64, 64)).astype(np.float32)
    x_np = rng.standard_normal((128, 64)).astype(np.float32)
    w, x = vs.put(w_np, P()), vs.put(x_np, P("data"))

    def f(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w).sum(0)

    y = pw.jit(f)(w, x)
    assert y.shape == (64,) and np.dtype(y.dtype) == np.float32
    np.testing.assert_allclose(np.asarray(y), jax.jit(f)(w_np, x_np), rtol=1e-5, atol=1e-5)


def test_mlp_forward_gradient_and_twenty_steps_match_plain_jax(client: pw.Client) -> None:
    vs = client.allocate({"data": 4})
    sizes = (16, 32, 4)
    params_np = init_params(sizes)
    x_np, y_np = make_data(64, sizes[0], sizes[-1])
    params = {k: vs.put(v, P()) for k, v in params_np.items()}
    x, y = vs.put(x_np, P("data")), vs.put(y_np, P("data"))

    loss_remote = pw.jit(loss_fn)(params, x, y)
    grads_remote = pw.jit(jax.grad(loss_fn))(params, x, y)
    np.testing.assert_allclose(float(loss_remote), loss_fn(params_np, x_np, y_np), rtol=1e-6)
    ref_grads = jax.grad(loss_fn)(params_np, x_np, y_np)
    got = pw.fetch(grads_remote)
    for k in params_np:
        np.testing.assert_allclose(got[k], ref_grads[k], rtol=1e-5, atol=1e-6)

    step = pw.jit(train_step, donate_argnums=0)
    ref_step = jax.jit(train_step)
    ref_params = jax.tree.map(jnp.asarray, params_np)
    losses, ref_losses = [], []
    for _ in range(20):
        params, loss = step(params, x, y)
        ref_params, ref_loss = ref_step(ref_params, x_np, y_np)
        losses.append(loss)
        ref_losses.append(float(ref_loss))
    np.testing.assert_allclose([float(v) for v in pw.fetch(losses)], ref_losses, rtol=1e-5)
    assert ref_losses[-1] < ref_losses[0]


def test_metadata_known_before_the_program_runs(client: pw.Client) -> None:
    vs = client.allocate({"data": 4})
    client.inject_fault(vs, match="slow_square", kind="delay:0.5")
    x = vs.put(np.ones((8, 4), np.float32), P("data"))

    @pw.jit
    def slow_square(x: jax.Array) -> jax.Array:
        return x * x

    y = slow_square(x)
    assert (y.shape, np.dtype(y.dtype), y.ndim, y.size, y.nbytes) == (
        (8, 4),
        np.float32,
        2,
        32,
        128,
    )
    assert y.sharding.spec == P("data")
    assert not y.is_ready()
    assert "pending" in repr(y)
    y.block_until_ready()
    assert y.is_ready()  # known at once, before the controller's completion notice


def test_retracing_follows_jax_rules(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    f = pw.jit(lambda x, n: x * n, static_argnums=1)
    a = vs.put(np.ones(4, np.float32), P("data"))
    b = vs.put(np.ones(6, np.float32), P("data"))
    c = vs.put(np.ones(4, np.int32), P("data"))
    d = vs.put(np.ones(4, np.float32), P())
    f(a, 2)
    f(a, 2)
    assert len(f._programs) == 1
    f(b, 2)  # new shape
    f(c, 2)  # new dtype
    f(d, 2)  # new sharding
    out = f(a, 3)  # new static argument
    assert len(f._programs) == 5
    np.testing.assert_array_equal(out.fetch(), np.full(4, 3.0, np.float32))


def test_donation_deletes_the_argument(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    f = pw.jit(lambda x: x + 1, donate_argnums=0)
    y = f(x)
    np.testing.assert_array_equal(y.fetch(), np.arange(1, 5, dtype=np.float32))
    assert x.is_deleted()
    with pytest.raises(pw.ClosedError, match="deleted or donated"):
        x.fetch()
    with pytest.raises(pw.ClosedError):
        f(x)
    with pytest.raises(ValueError, match=r"donate_argnums=\(2,\) names position 2.*takes 1"):
        pw.jit(lambda x: x, donate_argnums=2)  # as jax.jit refuses it
    # Passed by keyword, a donated argument is found through the signature, as in jax.jit.
    by = vs.put(np.full(4, 2.0, np.float32), P("data"))
    z = pw.jit(lambda a, by: a * by, donate_argnums=1)(y, by=by)
    np.testing.assert_array_equal(z.fetch(), 2 * np.arange(1, 5, dtype=np.float32))
    assert by.is_deleted() and not y.is_deleted()

    # donate_argnames, as jax.jit takes it: by name, positional or keyword-only; either
    # of argnums and argnames given alone implies the other through the signature.
    def scaled(a: Any, b: Any, *, c: Any = 1.0) -> Any:
        return a * b + c

    g = pw.jit(scaled, donate_argnames="a")
    ref = jax.jit(scaled, donate_argnames="a")
    assert (g.donate_argnums, g.donate_argnames) == ((0,), ("a",))
    assert pw.jit(scaled, donate_argnums=1).donate_argnames == ("b",)
    for call in (lambda f, a, b: f(a, b), lambda f, a, b: f(b=b, a=a)):
        a = vs.put(np.full(4, 3.0, np.float32), P("data"))
        out = call(g, a, y)
        assert a.is_deleted() and not y.is_deleted()
        np.testing.assert_array_equal(
            out.fetch(), np.asarray(call(ref, jnp.full(4, 3.0), y.fetch()))
        )
    c = vs.put(np.full(4, 5.0, np.float32), P("data"))
    np.testing.assert_array_equal(
        pw.jit(scaled, donate_argnames="c")(y, y, c=c).fetch(), y.fetch() ** 2 + 5
    )
    assert c.is_deleted()
    with pytest.raises(ValueError, match=r"donate_argnames names 'q', which scaled does not take"):
        pw.jit(scaled, donate_argnames="q")
    with pytest.raises(ValueError, match="both static and donated"):
        pw.jit(scaled, donate_argnames="a", static_argnames="a")


def test_a_program_takes_only_its_own_clients_arrays(cluster: pw.InProcessCluster) -> None:
    with pw.Client(cluster, name="alice") as alice, pw.Client(cluster, name="bob") as bob:
        a, b = alice.allocate({"x": 2}), bob.allocate({"x": 2})
        xa = a.put(np.ones(2, np.float32), P("x"))
        with pytest.raises(ValueError, match=r"another pw\.Client"):
            pw.jit(lambda v: v * 3, slice=b)(xa)
        np.testing.assert_array_equal(np.asarray(pw.jit(lambda v: v * 3, slice=a)(xa)), 3.0)


def test_slice_selection_rules(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    assert a.island != b.island  # the resource manager spreads slices
    f = pw.jit(lambda x: x + 1)
    xa = a.put(np.zeros(2, np.float32), P("x"))
    xb = b.put(np.zeros(2, np.float32), P("x"))
    assert f(xa).slice is a and f(xb).slice is b
    with pytest.raises(ValueError, match="different slices"):
        pw.jit(lambda x, y: x + y)(xa, xb)
    pinned = pw.jit(lambda x: x * 2, slice=b)
    assert pinned(xa).slice is b  # a pinned function moves its arguments (MPMD)
    with pytest.raises(TypeError, match="takes a VirtualSlice"):
        pw.jit(lambda x: x, slice=b.id)  # type: ignore[arg-type]
    g = pw.jit(lambda: jnp.arange(4.0))
    with b:
        assert g().slice is b
    assert g().slice is client.default_slice


def test_host_callbacks_fail_at_trace_time(client: pw.Client) -> None:
    vs = client.allocate({"x": 2})

    @pw.jit
    def noisy(x: jax.Array) -> jax.Array:
        jax.debug.print("x = {}", x)
        return x

    with pytest.raises(pw.TraceError, match="host callback"):
        noisy(vs.put(np.ones(2, np.float32)))

    @pw.jit
    def called_back(x: jax.Array) -> jax.Array:
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(pw.TraceError, match=r"host callback .*\(JAX: .*devices"):
        called_back(vs.put(np.ones(2, np.float32)))


def test_an_interrupt_during_a_trace_waits_for_the_trace_to_end(client: pw.Client) -> None:
    """Ctrl-C while JAX traces and lowers a program is raised once the trace is done: an
    interrupt inside JAX's first lowering would leave its MLIR context broken for every
    later trace in the process."""
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(2, dtype=np.float32))
    traced: list[str] = []

    def interrupted(v: jax.Array) -> jax.Array:
        _thread.interrupt_main()  # what "interrupt kernel" does, mid-trace
        traced.append("the rest of the trace ran")
        return v * 2

    with pytest.raises(KeyboardInterrupt):
        pw.jit(interrupted)(x)
    assert traced == ["the rest of the trace ran"]
    np.testing.assert_array_equal(np.asarray(pw.jit(lambda v: v + 1)(x)), [1.0, 2.0])
    # Outside a trace an interrupt is raised at once, as ever.
    with pytest.raises(KeyboardInterrupt):
        _thread.interrupt_main()
        threading.Event().wait(1.0)


def test_a_remote_array_captured_by_a_traced_function_is_a_clear_error(
    client: pw.Client,
) -> None:
    vs = client.allocate({"x": 2})
    w = vs.put(np.ones(2, np.float32))
    x = vs.put(np.arange(2, dtype=np.float32))
    with pytest.raises(TypeError, match=r"inside a traced function .* pass it as an argument"):
        pw.jit(lambda v: v * w)(x)
    with pytest.raises(TypeError, match=r"inside a traced function"):
        pw.jit(lambda v: w.clip(v, 3.0))(x)
    # Passed in, the same function runs.
    np.testing.assert_array_equal(np.asarray(pw.jit(lambda v, w: v * w)(x, w)), [0.0, 1.0])


def test_the_slices_mesh_is_the_context_mesh_while_tracing(client: pw.Client) -> None:
    """Bare PartitionSpecs work inside a pw.jit function as under ``jax.set_mesh``:
    ``shard_map`` without a mesh, ``with_sharding_constraint`` and ``reshard``."""
    vs = client.allocate({"data": 4})
    v = np.arange(8, dtype=np.float32)
    x = vs.put(v, P("data"))

    def step(a: jax.Array) -> Any:
        total = jax.shard_map(
            lambda b: jax.lax.psum(b, "data") + jax.lax.axis_index("data"),
            in_specs=P("data"),
            out_specs=P("data"),
        )(a)
        whole = jax.sharding.reshard(a * 2, P())
        split = jax.lax.with_sharding_constraint(a + 1, P("data"))
        return total, whole, split

    got = pw.jit(step)(x)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    with jax.set_mesh(mesh):
        want = jax.jit(step)(jax.device_put(v, jax.sharding.NamedSharding(mesh, P("data"))))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert [g.spec for g in got] == [w.sharding.spec for w in want]


def test_a_none_in_out_shardings_leaves_the_layout_to_the_compiler(client: pw.Client) -> None:
    """As in jax.jit: None for one output is not replicated; it comes out as the compiler
    lays it out, here following the input."""
    vs = client.allocate({"data": 2, "model": 2})
    v = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = vs.put(v, P("data"))
    got = pw.jit(lambda t: (t.T, t * 2), out_shardings=(P("model"), None))(x)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    want = jax.jit(
        lambda t: (t.T, t * 2),
        out_shardings=(jax.sharding.NamedSharding(mesh, P("model")), None),
    )(jax.device_put(v, jax.sharding.NamedSharding(mesh, P("data"))))
    assert [g.spec for g in got] == [w.sharding.spec for w in want] == [P("model"), P("data")]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_jit_arguments_of_the_wrong_kind_are_named() -> None:
    with pytest.raises(TypeError, match=r"static_argnums takes argument positions.*argnames"):
        pw.jit(lambda a: a, static_argnums="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"donate_argnums takes argument positions.*got \(0.5,\)"):
        pw.jit(lambda a: a, donate_argnums=(0.5,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name= is a string; got int"):
        pw.jit(lambda a: a, name=5)  # type: ignore[arg-type]
    assert pw.jit(lambda a, b: a, static_argnums=np.int64(1)).static_argnums == (1,)


def test_shardings_naming_other_axes_and_remote_static_arguments_are_named(
    client: pw.Client,
) -> None:
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("x"))

    def scale(a: jax.Array, k: object = 2.0) -> jax.Array:
        return a * 2

    with pytest.raises(ValueError, match=r"scale: in_shardings: .* names axis 'y', but slice"):
        pw.jit(scale, in_shardings=P("y"))(x)
    with pytest.raises(ValueError, match=r"scale: out_shardings: .*axis 'data'.*has axes \['x'\]"):
        pw.jit(scale, out_shardings=(P("data"),))(x)
    # An in_sharding that does not split its argument evenly is refused, as jax.jit does.
    odd = np.arange(6, dtype=np.float32).reshape(3, 2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    with pytest.raises(ValueError):
        jax.jit(scale, in_shardings=jax.sharding.NamedSharding(mesh, P("x")))(odd)
    with pytest.raises(ValueError, match=r"scale: in_shardings for input 0 \(float32\[3, 2\]\): "):
        pw.jit(scale, in_shardings=P("x"))(vs.put(odd, P()))
    np.testing.assert_array_equal(
        np.asarray(pw.jit(scale, in_shardings=P(None, "x"))(odd)), odd * 2
    )
    # Hashable, so it would pass as a static value and fail inside the trace instead.
    with pytest.raises(TypeError, match="a RemoteArray cannot be a static argument"):
        pw.jit(scale, static_argnames="k")(x, k=x)
    with pytest.raises(TypeError, match="a RemoteArray cannot be a static argument"):
        pw.jit(scale, static_argnums=1)(x, x)
    # An unhashable static argument is a ValueError, as in jax.jit.
    with pytest.raises(ValueError):
        jax.jit(scale, static_argnums=1)(np.ones(4, np.float32), [2.0])
    with pytest.raises(ValueError, match=r"scale: static arguments must be hashable.*list \[2.0\]"):
        pw.jit(scale, static_argnums=1)(x, [2.0])
    vs.release()


def test_trace_errors_name_the_users_function_and_program(client: pw.Client) -> None:
    """JAX's own trace errors point at the decorated function's source, as under jax.jit,
    and a note names the program, the slice and the inputs."""
    vs = client.allocate({"x": 2})

    @pw.jit
    def returns_text(x: jax.Array) -> Any:
        return "not an array"

    with pytest.raises(TypeError, match=r"returns_text at .*test_inprocess_programs\.py") as info:
        returns_text(vs.put(np.ones(2, np.float32)))
    assert "_jit.py" not in str(info.value)
    assert any("returns_text" in n and "float32[2]" in n for n in info.value.__notes__)


def test_pw_jit_functions_compose_as_nested_jax_jit(client: pw.Client) -> None:
    """Called inside another traced function, a pw.jit function traces into it (as a
    nested jax.jit does) instead of launching: inside pw.jit, jax.jit and jax.grad."""
    vs = client.allocate({"data": 2})
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)

    @pw.jit
    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    scale = pw.jit(lambda v, n: v * n, static_argnums=1, out_shardings=P())

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return scale(layer(w, x), 2.0).sum()

    want = jax.grad(loss)(jnp.asarray(w), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(w, x)), want, rtol=1e-6)
    rw, rx = vs.put(w, P()), vs.put(x, P("data"))
    got = pw.jit(jax.grad(loss))(rw, rx)
    assert got.slice is vs
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    out = pw.jit(lambda w, x: scale(layer(w, x), 3.0))(rw, rx)
    assert out.spec == P()  # the inner out_shardings hold inside the outer program
    np.testing.assert_allclose(np.asarray(out), 3 * np.tanh(x @ w), rtol=1e-6)


def test_clear_cache_traces_again_as_jax_jit_does(client: pw.Client) -> None:
    """A traced function keeps what it read of a global until its cache is cleared,
    under jax.jit and pw.jit alike."""
    vs = client.allocate({"data": 2})
    scale = {"now": 2.0}

    def scaled(x: jax.Array) -> jax.Array:
        return x * scale["now"]

    f, g = pw.jit(scaled), jax.jit(scaled)
    x, j = vs.put(np.ones(4, np.float32)), jnp.ones(4, jnp.float32)
    assert np.asarray(f(x))[0] == np.asarray(g(j))[0] == 2.0
    scale["now"] = 3.0
    assert np.asarray(f(x))[0] == np.asarray(g(j))[0] == 2.0  # the trace is kept
    f.clear_cache()
    g.clear_cache()
    assert np.asarray(f(x))[0] == np.asarray(g(j))[0] == 3.0
    assert repr(f) == "<pw.jit scaled (1 programs)>"


def test_eval_shape_and_lower_work_as_in_jax(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones((4, 3), np.float32), P("data"))
    f = pw.jit(lambda x: (x.sum(1), x.T))
    shapes = f.eval_shape(x)
    assert shapes[0].shape == (4,) and shapes[1].shape == (3, 4)
    lowered = f.lower(x)
    text = lowered.as_text()
    assert "stablehlo" in text or "mhlo" in text
    assert lowered.out_info[1].shape == (3, 4)
    with pytest.raises(TypeError, match="compiles on its slice's host"):
        lowered.compile()
    # trace() as jax.jit's: the jaxpr and output shapes, and a lowering from it.
    traced = f.trace(x)
    want = jax.jit(lambda x: (x.sum(1), x.T)).trace(jnp.ones((4, 3), jnp.float32))
    assert str(traced.jaxpr) == str(want.jaxpr)
    assert [o.shape for o in traced.out_info] == [(4,), (3, 4)]
    assert traced.lower().as_text() == text


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


def print_of(value: Any) -> str:
    out = io.StringIO()
    print(value, file=out)
    return out.getvalue()


def test_await_gives_the_value_without_blocking_the_event_loop(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    v = np.arange(8, dtype=np.float32)
    x = vs.put(v, P("data"))
    client.inject_fault(vs, match="fails_awaited")
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
        slow = pw.jit(lambda t: functools.reduce(lambda a, _: jnp.sin(a) + t, range(200), t))
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


def test_many_dependent_calls_are_submitted_without_waiting(client: pw.Client) -> None:
    vs = client.allocate({"data": 4})
    x = vs.put(np.ones((64, 64), np.float32), P("data"))
    client.inject_fault(vs, match="step", kind="delay:1.0")

    @pw.jit
    def step(x: jax.Array) -> jax.Array:
        return x * 1.0001

    for _ in range(1000):
        x = step(x)
    # The first launch holds the host for a second, so every launch is still queued
    # when submission returns: nothing waited for a reply.
    assert client.pending() >= 999
    np.testing.assert_allclose(x.fetch(), np.full((64, 64), 1.0001**1000, np.float32), rtol=1e-4)
    client.wait_all(timeout=60)
    ev = client.events()
    ends = ev[(ev.kind == "end") & (ev.program == "step")]
    assert len(ends) == 1000


def test_completion_notices_are_batched_and_failures_are_not(
    client: pw.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller tells a client about finished launches in few messages (a fetch
    already says its program finished); a failure it tells at once."""
    vs = client.allocate({"data": 4})
    x = vs.put(np.ones((8,), np.float32), P("data"))
    pushes: list[dict] = []
    on_push = client._io._on_push

    def counting(h: dict) -> None:
        if h["t"] == "done":
            pushes.append(h)
        on_push(h)

    monkeypatch.setattr(client._io, "_on_push", counting)
    step = pw.jit(lambda v: v + 1.0)
    for _ in range(10):
        for _ in range(20):
            x = step(x)
        x.block_until_ready()
        assert x.is_ready()
    client.wait_all(timeout=30)
    assert client.pending() == 0
    np.testing.assert_array_equal(x.fetch(), np.full((8,), 201.0, np.float32))
    assert sum(len(h["items"]) for h in pushes) == 200 and len(pushes) < 100, len(pushes)

    # Successes now wait (in practice) forever for company; a failure still goes at once,
    # and takes the waiting successes with it.
    monkeypatch.setattr("pathways_nb.controller._hosts._DONE_DELAY", 3600.0)
    pushes.clear()
    for _ in range(3):
        x = step(x)
    x.block_until_ready()
    client.inject_fault(vs, match="_boom", kind="error")
    bad = pw.jit(_boom)(x)
    with pytest.raises(pw.RemoteError, match="injected fault"):
        bad.block_until_ready()
    client.wait_all(timeout=30)
    assert [err is not None for h in pushes for _, err in h["items"]] == [False] * 3 + [True]


def _boom(v: jax.Array) -> jax.Array:
    return v * 2.0


def test_scalar_operator_programs_are_bounded(
    client: pw.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pathways_nb.client._programs._MAX_OPS", 3)
    vs = client.allocate({"data": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    for i in range(6):
        np.testing.assert_array_equal((x * i).fetch(), np.arange(4, dtype=np.float32) * i)
    assert len(client._ops) == 3


def test_a_program_that_ignores_its_inputs_still_runs_on_the_whole_slice(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 4})
    x = vs.put(np.ones((8, 2), np.float32), P("data"))
    z = pw.jit(jnp.zeros_like)(x)
    assert z.slice is vs
    np.testing.assert_array_equal(np.asarray(z), np.zeros((8, 2), np.float32))
    w = pw.jit(lambda v: (jnp.arange(3.0), v.shape[0]), static_argnums=())(x)
    np.testing.assert_array_equal(np.asarray(w[0]), np.arange(3.0))
    vs.release()


def test_a_host_keeps_its_most_recent_executables_and_compiles_a_dropped_one_again() -> None:
    """A sweep that traces a new function per value sends a new program each time; the
    host keeps only the most recently used executables (PATHWAYS_HOST_EXECUTABLES)."""
    with pw.InProcessCluster(1, 2, config=pw.Config(host_executables=4)) as cluster:
        client = cluster.client()
        vs = client.allocate({"x": 2})
        x = vs.put(np.arange(4, dtype=np.float32), P("x"))
        scaled = [pw.jit(lambda a, k=k: a * k) for k in range(10)]
        for k, f in enumerate(scaled):
            np.testing.assert_array_equal(np.asarray(f(x)), np.arange(4) * k)
        _, stats = cluster.hosts[0].statistics()
        assert stats.executables == 4 and stats.compiles >= 10
        # The first is gone from the host; launched again, it compiles again and runs.
        np.testing.assert_array_equal(np.asarray(scaled[0](x) + 1), np.ones(4))
        _, again = cluster.hosts[0].statistics()
        assert again.executables == 4 and again.compiles > stats.compiles
        assert len(cluster.hosts[0].executor._plans) <= 4
