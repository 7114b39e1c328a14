"""Programs on an in-process cluster give the numbers plain JAX gives."""

from __future__ import annotations

import _thread
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
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


def test_64_bit_types_in_a_context_hold_on_in_process_hosts(client: pw.Client) -> None:
    """``jax.enable_x64`` as a context holds in the client's thread only; the hosts'
    threads, in this process too, keep the client's dtypes (a float64 put came back as
    float32, silently, and a program of it did not compile)."""
    a, b = client.allocate({"data": 2}), client.allocate({"data": 2})
    v = np.arange(8.0) / 3

    def f(q: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        return q * 2 + 1e-12, i * 3_000_000_000

    with jax.enable_x64(True):
        x, i = a.put(v, P("data")), a.put(np.arange(8), P("data"))
        assert (x.dtype, i.dtype) == (np.float64, np.int64)
        np.testing.assert_array_equal(x.fetch(), v)
        got = pw.jit(f)(x, i)
        moved = pw.jit(lambda q: q, slice=b)(got[0])  # host to host, still 64-bit
        want = jax.jit(f)(v, np.arange(8))
        for g, w in zip([*got, moved], [*want, want[0]], strict=True):
            assert g.fetch().dtype == w.dtype
            np.testing.assert_array_equal(g.fetch(), np.asarray(w))
    a.release()
    b.release()


def test_a_64_bit_array_used_without_64_bit_types_says_how_to_convert_it(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 2})
    with jax.enable_x64(True):
        x = vs.put(np.arange(4.0), P("data"))
    # The host holds float64, which a program traced without x64 cannot take.
    for call in (lambda: pw.jit(lambda a: a * 2)(x), lambda: x + 1):
        with pytest.raises(TypeError, match=r"input 0 is float64\[4\], made while jax_enable_x64"):
            call()
    with jax.enable_x64(True):
        y = x.astype(np.float32)  # as the message says
    np.testing.assert_array_equal(pw.jit(lambda a: a * 2)(y).fetch(), np.arange(4.0) * 2)
    vs.release()


def test_put_refuses_what_no_program_could_take(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    with pytest.raises(TypeError, match=r"sub-byte dtypes such as int4.*as int8"):
        vs.put(np.arange(4).astype(jnp.int4), P("data"))
    with pytest.raises(TypeError, match="numeric or boolean arrays"):
        vs.put(np.array(["a", "b"]), P())


def test_an_argument_no_program_could_take_is_named_in_the_call(client: pw.Client) -> None:
    """As jax.jit's error names the parameter and the path inside it."""
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(4, np.float32), P("data"))

    def f(n: int, x: Any, opts: Any = None) -> Any:
        return x

    with pytest.raises(TypeError, match=r"f: argument 'opts' \(str\) cannot be passed.*static"):
        pw.jit(f, static_argnums=0)(3, x, "fast")
    with pytest.raises(TypeError, match=r"f: keyword argument 'opts'\['a'\]\[1\] \(str\)"):
        pw.jit(f)(3, x, opts={"a": [1.0, "b"]})
    with pytest.raises(TypeError, match=r"positional argument 1 \(str\).*numeric or boolean"):
        pw.jit(lambda *a: a[0])(x, "b")
    # Marked static, the same value is fixed in the program.
    np.testing.assert_array_equal(pw.jit(f, static_argnums=(0, 2))(3, x, "fast"), np.ones(4))


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


def test_a_setting_that_changes_the_trace_traces_again_as_in_jax(client: pw.Client) -> None:
    """jax.jit keys its cache on the settings a trace depends on; a program traced
    before a setting changed was run after it, as if it had not."""
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(4, np.float32), P("data"))

    def outer_plus(a: jax.Array) -> jax.Array:
        return a[:, None] * a[None, :] + a  # (4, 4) + (4,): a rank promotion

    f, g = pw.jit(outer_plus), jax.jit(outer_plus)
    np.testing.assert_array_equal(f(x).fetch(), np.asarray(g(np.ones(4, np.float32))))
    with jax.numpy_rank_promotion("raise"):
        with pytest.raises(ValueError, match="jax_numpy_rank_promotion='raise'"):
            g(np.ones(4, np.float32))
        with pytest.raises(ValueError, match="jax_numpy_rank_promotion='raise'"):
            f(x)
    ramp = pw.jit(lambda a: a + jnp.arange(4.0))
    assert ramp(x).dtype == np.float32
    with jax.enable_x64(True):
        want = jax.jit(lambda a: a + jnp.arange(4.0))(np.ones(4, np.float32))
        got = ramp(x)
        assert got.dtype == want.dtype == np.float64
        np.testing.assert_array_equal(got.fetch(), np.asarray(want))
    assert ramp(x).dtype == np.float32 and len(ramp._programs) == 2
    vs.release()


def test_jax_jit_options_reach_the_export_and_the_hosts_compiler(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))

    def first(a: jax.Array, b: jax.Array) -> jax.Array:
        return a

    def params(f: Any) -> int:
        return f.lower(x, x).as_text().split("@main(", 1)[1].split(") ->")[0].count("%arg")

    assert params(pw.jit(first)) == 1 and params(pw.jit(first, keep_unused=True)) == 2
    np.testing.assert_array_equal(pw.jit(first, keep_unused=True)(x, x).fetch(), np.arange(4))
    np.testing.assert_array_equal(pw.jit(first, inline=True)(x, x).fetch(), np.arange(4))
    # Options go to the host that compiles: one XLA does not know fails there, as jax.jit's
    # compile does; one it knows compiles a program of its own.
    fast = pw.jit(lambda a: a * 2, compiler_options={"xla_cpu_enable_fast_math": True})
    np.testing.assert_array_equal(fast(x).fetch(), np.arange(4) * 2.0)
    plain = pw.jit(lambda a: a * 2)
    plain(x)
    assert next(iter(fast._programs.values())).pid != next(iter(plain._programs.values())).pid
    bogus = pw.jit(lambda a: a * 2, compiler_options={"xla_no_such_option": 1})
    with pytest.raises(pw.RemoteError, match="No such compile option: 'xla_no_such_option'"):
        bogus(x).fetch()
    with pytest.raises(TypeError, match=r"compiler_options\['xla_a'\] is a boolean, number"):
        pw.jit(lambda a: a, compiler_options={"xla_a": [1]})
    with pytest.raises(ValueError, match="places a program on a slice, not on a device"):
        pw.jit(lambda a: a, device=jax.devices()[0])
    with pytest.raises(ValueError, match="not on a backend"):
        pw.jit(backend="cpu")(lambda a: a)
    with pytest.raises(ValueError, match=r"abstracted_axes .* cannot be exported"):
        pw.jit(lambda a: a, abstracted_axes=("n",))
    vs.release()


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
    assert "_jit.py" not in str(info.value) and "_export.py" not in str(info.value)
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
    # trace() as jax.jit's: the jaxpr and output shapes, and a lowering from it.
    traced = f.trace(x)
    want = jax.jit(lambda x: (x.sum(1), x.T)).trace(jnp.ones((4, 3), jnp.float32))
    assert str(traced.jaxpr) == str(want.jaxpr)
    assert [o.shape for o in traced.out_info] == [(4,), (3, 4)]
    assert traced.lower().as_text() == text


def test_compile_runs_on_the_slices_host_and_reports_what_jax_reports(
    cluster: pw.InProcessCluster, client: pw.Client
) -> None:
    """``f.lower(...).compile()`` compiles where the slice's devices are: its memory
    analysis is what jax.jit's compile says of the same program on as many devices, and
    the first call runs the executable it compiled."""
    vs = client.allocate({"data": 2})
    host = next(h for h in cluster.hosts if h.name == vs.host)

    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    w = vs.put(np.ones((64, 64), np.float32), P())
    x = vs.put(np.ones((128, 64), np.float32), P("data"))
    f = pw.jit(layer, donate_argnums=1)
    _, start = host.statistics()
    compiled = f.lower(w, x).compile()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    want = (
        jax.jit(layer, donate_argnums=1)
        .lower(
            jax.ShapeDtypeStruct((64, 64), np.float32, sharding=NamedSharding(mesh, P())),
            jax.ShapeDtypeStruct((128, 64), np.float32, sharding=NamedSharding(mesh, P("data"))),
        )
        .compile()
    )
    got_mem, want_mem = compiled.memory_analysis(), want.memory_analysis()
    for field in ("argument", "output", "alias", "temp"):
        name = f"{field}_size_in_bytes"
        assert getattr(got_mem, name) == getattr(want_mem, name), name
    assert got_mem.alias_size_in_bytes == 128 * 64 * 4 // 2  # the donation, per device
    with pytest.raises(AttributeError, match="reported no flops_in_bytes"):
        _ = got_mem.flops_in_bytes
    assert compiled.cost_analysis()["transcendentals"] == want.cost_analysis()["transcendentals"]
    assert "input_output_alias" in compiled.as_text() and "tanh" in compiled.as_text()
    assert compiled.output_shardings.spec == P("data")
    args, kwargs = compiled.input_shardings
    assert [s.spec for s in args] == [P(), P("data")] and kwargs == {}
    assert [s.spec for s in want.input_shardings[0]] == [P(), P("data")]
    _, before = host.statistics()
    # One executable, with the donation: learning the output layouts compiled another.
    assert before.compiles == start.compiles + 1
    y = compiled(w, x)
    np.testing.assert_allclose(y.fetch(), np.tanh(np.full((128, 64), 64.0, np.float32)))
    assert x.is_deleted()
    _, after = host.statistics()
    assert after.compiles == before.compiles  # the call ran what compile() compiled
    # As jax.stages.Compiled: arguments of other types are refused, naming both.
    other = vs.put(np.ones((64, 64), np.float32), P("data"))
    with pytest.raises(TypeError, match=r"compiled for inputs \(float32\[64, 64\] laid out as "):
        compiled(other, vs.put(np.ones((128, 64), np.float32), P("data")))
    assert not other.is_deleted()  # refused before anything ran
    # Host arrays are laid out as compiled, as jax.stages.Compiled shards them, and the
    # call still runs the executable compile() made.
    host_x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64) / 8192
    y = compiled(w, host_x)
    np.testing.assert_allclose(
        y.fetch(), np.tanh(host_x @ np.ones((64, 64), np.float32)), rtol=1e-5
    )
    assert y.spec == P("data") and host.statistics()[1].compiles == after.compiles
    with pytest.raises(TypeError, match=r"called with inputs \(float32\[64, 64\] laid out as "):
        compiled(w, np.ones((64, 64), np.float32))  # another shape is still refused
    # Abstract arguments need no array on the slice, as for jax.jit's lower.
    shaped = jax.ShapeDtypeStruct((256, 64), np.float32)
    g = pw.jit(lambda w, x: x @ w, slice=vs, in_shardings=(P(), P("data")))
    assert g.lower(w, shaped).compile().memory_analysis().argument_size_in_bytes == (
        64 * 64 * 4 + 256 * 64 * 4 // 2
    )
    # A bare PartitionSpec over the slice's axes, as under jax.set_mesh in JAX.
    bare = jax.ShapeDtypeStruct((256, 64), np.float32, sharding=P("data"))
    h = pw.jit(lambda w, x: x @ w, slice=vs)
    assert h.lower(w, bare).compile().input_shardings[0][1].spec == P("data")
    assert h.eval_shape(w, bare).shape == (256, 64)
    assert f.eval_shape(w, bare).shape == (256, 64)  # the slice of w
    with pytest.raises(ValueError, match=r"this function has no slice yet: pin it"):
        pw.jit(lambda x: x * 2).eval_shape(bare)
    # Options given to compile() are the host compiler's, as in jax.jit's.
    z = vs.put(np.ones((128, 64), np.float32), P("data"))
    with pytest.raises(pw.RemoteError, match="No such compile option: 'xla_no_such'"):
        f.lower(w, z).compile({"xla_no_such": 1})
    fast = f.lower(w, z).compile({"xla_cpu_enable_fast_math": True})
    assert fast(w, z).shape == (128, 64)
    vs.release()


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


def test_a_departed_clients_programs_go_unless_another_uses_them() -> None:
    """A cluster outliving many notebooks keeps only the programs of the clients still
    connected, on the controller and on the hosts (compiled executables included)."""
    import time

    with pw.InProcessCluster(1, 2) as cluster:
        a, b = cluster.client(name="a"), cluster.client(name="b")
        va, vb = a.allocate({"x": 1}), b.allocate({"x": 1})
        x = va.put(np.arange(4, dtype=np.float32), P())
        y = vb.put(np.arange(4, dtype=np.float32), P())
        shared = pw.jit(lambda v: v + 1, name="shared")
        mine = pw.jit(lambda v: v * 3, name="mine")
        np.testing.assert_array_equal(shared(x).fetch(), np.arange(4) + 1)
        np.testing.assert_array_equal(mine(x).fetch(), np.arange(4) * 3)
        np.testing.assert_array_equal(shared(y).fetch(), np.arange(4) + 1)
        host = cluster.hosts[0]

        def counts() -> tuple[int, int, int]:
            executor = host.statistics()[1]
            return cluster.controller.statistics().programs, executor.programs, executor.executables

        # shared is compiled for each client's device, mine for one.
        assert counts() == (2, 2, 3)
        a.close()
        deadline = time.monotonic() + 10
        while counts() != (1, 1, 2):  # the host drops them behind its queued work
            assert time.monotonic() < deadline, counts()
            time.sleep(0.01)
        # The program the other client uses stays, compiled.
        np.testing.assert_array_equal(shared(y).fetch(), np.arange(4) + 1)
        assert host.statistics()[1].compiles == 3
        b.close()
        while counts() != (0, 0, 0):
            assert time.monotonic() < deadline, counts()
            time.sleep(0.01)


def test_a_function_traced_on_one_cluster_runs_on_the_next() -> None:
    """A notebook that stops its cluster and starts another (``%pathways stop`` and
    ``start``) calls the same pw.jit functions again: each client sends the programs its
    controller has not got, traced before or not."""
    f = pw.jit(lambda v: v + 1, name="f")
    for _ in range(2):
        with pw.InProcessCluster(1, 2) as cluster:
            vs = cluster.client().allocate({"x": 2})
            x = vs.put(np.arange(4, dtype=np.float32), P("x"))
            np.testing.assert_array_equal(f(x).fetch(), np.arange(4) + 1)
    assert len(f._programs) == 1  # traced once


def test_a_function_pinned_to_a_closed_clients_slice_says_so() -> None:
    with pw.InProcessCluster(1, 2) as cluster:
        old = cluster.client()
        pinned = pw.jit(lambda v: v + 1, slice=old.allocate({"x": 2}), name="pinned")
        old.close()
        vs = cluster.client().allocate({"x": 2})
        x = vs.put(np.arange(4, dtype=np.float32), P("x"))
        with pytest.raises(pw.ClosedError, match="pinned to slice 's1' of a client that was"):
            pinned(x)
        np.testing.assert_array_equal(pw.jit(pinned.fun, slice=vs)(x).fetch(), np.arange(4) + 1)
