"""Pipelines: a 4-stage MLP over 4 slices, trained like plain JAX on one device set."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

import pathways_nb as pw


def layer(p: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["w"] + p["b"])


def head(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def mse(out: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((out - y) ** 2)


def _params(sizes: list[int]) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
            "b": np.zeros(b, np.float32),
        }
        for a, b in itertools.pairwise(sizes)
    ]


def _reference(
    params: list[dict],
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    opt: object = None,
    stages: list[Any] | None = None,
) -> list[float]:
    stages = stages or [layer, layer, layer, head]
    opt = opt or optax.adam(1e-2)

    def loss(ps: list[dict]) -> jax.Array:
        h = jnp.asarray(x)
        for f, p in zip(stages, ps, strict=True):
            h = f(p, h)
        return mse(h, y)

    @jax.jit
    def step(ps: list[dict], st: object) -> tuple[list[dict], object, jax.Array]:
        v, g = jax.value_and_grad(loss)(ps)
        upd, st = opt.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, v

    ps = jax.tree.map(jnp.asarray, params)
    st = opt.init(ps)
    out = []
    for _ in range(steps):
        ps, st, v = step(ps, st)
        out.append(float(v))
    return out


def _trained(objective: Any, params: Any, opt: Any, steps: int) -> tuple[list[float], Any]:
    """Plain JAX: ``steps`` steps of ``opt`` on ``objective(params)``, in one program
    over the whole batch; every step's loss and the final parameters."""
    ps = jax.tree.map(jnp.asarray, params)
    st = opt.init(ps)
    losses = []
    for _ in range(steps):
        v, g = jax.value_and_grad(objective)(ps)
        upd, st = opt.update(g, st, ps)
        ps = optax.apply_updates(ps, upd)
        losses.append(float(v))
    return losses, ps


SIZES = [8, 32, 32, 32, 4]


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((64, SIZES[-1])).astype(np.float32)
    return x, y


def _train(
    step: pw.Pipeline, x: object, y: object, steps: int, start: list | None = None
) -> tuple[list, list[float]]:
    """``steps`` steps from ``start`` (the parameters of ``_params(SIZES)`` if None):
    the final parameters and every step's loss."""
    params, state = step.init(start if start is not None else _params(SIZES))
    losses = []
    for _ in range(steps):
        params, state, loss = step(params, state, x, y)
        losses.append(loss)
    return params, [float(v) for v in pw.fetch(losses)]


@pytest.fixture(scope="module")
def four() -> Iterator[pw.Client]:
    """Four islands of two devices: one slice per stage, each on its own island."""
    cluster = pw.InProcessCluster(islands=4, devices_per_island=2)
    client = cluster.client()
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def slices(four: pw.Client) -> Iterator[list[pw.VirtualSlice]]:
    """One 2-device slice per island, released after the test whatever happens."""
    out = [four.allocate({"data": 2}) for _ in range(4)]
    yield out
    for s in out:
        s.release()


@pytest.mark.parametrize(
    ("schedule", "remat", "extra_warmup"),
    [("gpipe", False, 0), ("1f1b", False, 0), ("1f1b", True, 0), ("1f1b", False, 1)],
)
def test_a_four_stage_pipeline_trains_like_plain_jax(
    four: pw.Client, slices: list[pw.VirtualSlice], schedule: str, remat: bool, extra_warmup: int
) -> None:
    assert len({s.island for s in slices}) == 4
    x, y = _batch()
    step = pw.pipeline(
        [layer, layer, layer, head],
        slices,
        mse,
        optax.adam(1e-2),
        microbatches=8,
        schedule=schedule,
        remat=remat,
        extra_warmup=extra_warmup,
    )
    params, got = _train(step, x, y, 5)
    np.testing.assert_allclose(got, _reference(_params(SIZES), x, y, 5), rtol=2e-5, atol=1e-6)
    assert [p["w"].slice for p in params] == slices  # parameters stay on their stage's slice


@pytest.mark.parametrize(("schedule", "remat"), [("1f1b", False), ("gpipe", True)])
def test_gradients_summed_per_device_and_reduced_once_per_step_train_like_plain_jax(
    four: pw.Client, slices: list[pw.VirtualSlice], schedule: str, remat: bool
) -> None:
    x, y = _batch()
    step = pw.pipeline(
        [layer, layer, layer, head],
        slices,
        mse,
        optax.sgd(0.5),  # plain SGD: a gradient off by any factor changes the losses
        microbatches=8,
        schedule=schedule,
        remat=remat,
        batch_spec=PartitionSpec("data"),
        reduce_grads="step",
    )
    params, got = _train(step, x, y, 5)
    np.testing.assert_allclose(
        got, _reference(_params(SIZES), x, y, 5, optax.sgd(0.5)), rtol=2e-5, atol=1e-6
    )
    # The per-device sums are added up in the update: parameters stay whole and replicated.
    assert [p["w"].shape for p in params] == [(a, b) for a, b in itertools.pairwise(SIZES)]
    assert all(p["w"].sharding.spec == PartitionSpec() for p in params)


@pytest.mark.parametrize("reduce_grads", ["microbatch", "step"])
def test_slices_with_explicit_axes_train_like_plain_jax(four: pw.Client, reduce_grads: str) -> None:
    """Stages on slices whose axes are Explicit (jax.make_mesh's default): the step's own
    layouts are reshards there, where a sharding constraint would only assert."""
    slices = [four.allocate({"data": 2}, axis_types="explicit") for _ in range(4)]
    try:
        x, y = _batch()
        step = pw.pipeline(
            [layer, layer, layer, head],
            slices,
            mse,
            optax.sgd(0.5),
            microbatches=4,
            batch_spec=PartitionSpec("data"),
            reduce_grads=reduce_grads,
        )
        _, got = _train(step, x, y, 3)
        np.testing.assert_allclose(
            got, _reference(_params(SIZES), x, y, 3, optax.sgd(0.5)), rtol=2e-5, atol=1e-6
        )
    finally:
        for s in slices:
            s.release()


@pytest.mark.parametrize(
    ("schedule", "reduce_grads", "opt", "skip"),
    [("1f1b", "microbatch", optax.adam(1e-2), True), ("gpipe", "step", optax.sgd(0.5), False)],
)
def test_clipping_to_the_global_norm_of_all_stages_trains_like_plain_jax(
    slices: list[pw.VirtualSlice], schedule: str, reduce_grads: str, opt: Any, skip: bool
) -> None:
    """clip_grad_norm clips the gradients of all stages together, as
    optax.clip_by_global_norm clips one model's; the norm here is small enough that
    every step clips (per-stage clipping, or none, gives other losses). Steps whose
    gradients are finite are taken under skip_nonfinite."""
    x, y = _batch()
    step = pw.pipeline(
        [layer, layer, layer, head],
        slices,
        mse,
        opt,
        microbatches=4,
        schedule=schedule,
        batch_spec=PartitionSpec("data"),
        reduce_grads=reduce_grads,
        clip_grad_norm=0.05,
        skip_nonfinite=skip,
    )
    assert "clip_grad_norm=0.05" in repr(step)
    _, got = _train(step, x, y, 4)
    clipped = optax.chain(optax.clip_by_global_norm(0.05), opt)
    want = _reference(_params(SIZES), x, y, 4, clipped)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    unclipped = _reference(_params(SIZES), x, y, 4, opt)
    assert not np.allclose(want, unclipped, rtol=1e-3)


def test_a_step_with_a_nonfinite_gradient_on_one_stage_is_skipped_on_every_stage(
    slices: list[pw.VirtualSlice],
) -> None:
    """skip_nonfinite skips a step on every stage when one stage's gradients are not
    finite, as optax.apply_if_finite skips it for the whole model in one program."""

    def gated(p: dict, x: jax.Array) -> jax.Array:
        # d/ds sqrt(s) is inf at s = 0: this stage's gradient alone is not finite.
        return layer(p, x) * jnp.sqrt(p["s"])

    stages = [layer, layer, gated, head]
    params = _params(SIZES)
    params[2] = {**params[2], "s": np.zeros((), np.float32)}
    x, y = _batch()
    step = pw.pipeline(stages, slices, mse, optax.adam(1e-2), microbatches=4, skip_nonfinite=True)
    assert "skip_nonfinite=True" in repr(step)
    p, got = _train(step, x, y, 3, params)
    whole = optax.apply_if_finite(optax.adam(1e-2), 10)
    np.testing.assert_allclose(got, _reference(params, x, y, 3, whole, stages), rtol=1e-6)
    assert len(set(got)) == 1  # no stage moved
    for now, before in zip(jax.tree.leaves(pw.fetch(p)), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(now, before)
    # Without it, a stage whose gradients were finite moves on alone (the head's bias:
    # its weights see the gated stage's zeros).
    per_stage = pw.pipeline(stages, slices, mse, optax.sgd(0.1), microbatches=4)
    q, qs = per_stage.init(params)
    q, qs, _ = per_stage(q, qs, x, y)
    assert not np.array_equal(np.asarray(q[3]["b"]), params[3]["b"])


def test_parameters_without_gradients_are_refused_before_anything_runs(
    slices: list[pw.VirtualSlice],
) -> None:
    """An integer parameter has a float0 gradient, which holds no values: refused with
    where it is and what to do, where a step failed deep inside with JAX's words."""
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(0.1), microbatches=4)
    params = _params(SIZES)
    params[1] = {**params[1], "n": np.int32(3)}
    with pytest.raises(TypeError, match=r"params\[1\]\['n'\] is int32.*close over it"):
        step.init(params)
    good, state = step.init(_params(SIZES))
    x, y = _batch()
    with pytest.raises(TypeError, match=r"params\[2\]\['b'\] is bool"):
        step([*good[:2], {**good[2], "b": np.zeros(3, bool)}, good[3]], state, x, y)


def test_a_loss_that_is_not_a_float_scalar_is_refused(slices: list[pw.VirtualSlice]) -> None:
    """What jax.grad refuses to differentiate, and a (loss, metrics) pair, are named
    with what to return instead (a tuple had failed dividing it, an integer loss had
    trained on zero gradients)."""
    params = _params(SIZES)
    x, y = _batch()
    for loss, got in (
        (lambda o, t: jnp.mean((o - t) ** 2, axis=1), r"float32\[16\]"),
        (lambda o, t: (mse(o, t), {"mean": jnp.mean(o)}), r"\(float32\[\], dict\)"),
        (lambda o, t: jnp.int32(1), r"int32\[\]"),
    ):
        step = pw.pipeline(
            [layer, layer, layer, head], slices, loss, optax.sgd(0.1), microbatches=4
        )
        p, st = step.init(params)
        with pytest.raises(TypeError, match=rf"returns the microbatch's loss.*returned {got}"):
            step(p, st, x, y)
    pairs = pw.pipeline(
        [layer, layer, layer, head], slices, mse, optax.sgd(0.1), microbatches=4, weighted_loss=True
    )
    p, st = pairs.init(params)
    with pytest.raises(TypeError, match=r"returns a pair .* it returned float32\[\]"):
        pairs(p, st, x, y)
    with pytest.raises(TypeError, match="weighted_loss is True or False"):
        pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(0.1), weighted_loss=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("reduce_grads", "clip"), [("microbatch", None), ("step", 0.05)])
def test_a_weighted_loss_trains_like_the_whole_batchs_masked_mean_in_plain_jax(
    slices: list[pw.VirtualSlice], reduce_grads: str, clip: float | None
) -> None:
    """A loss over masked rows: the mean of the microbatches' masked means is another
    objective when their masks hold different counts; weighted_loss gives the batch's
    own, sum over weight, with its gradients (and global-norm clipping of those)."""
    x, y = _batch()
    mask = (np.arange(64) % 7 < np.arange(64) // 16 + 1).astype(np.float32)  # 3..12 per 16 rows

    def per_row(o: jax.Array, t: jax.Array) -> jax.Array:
        return jnp.mean((o - t) ** 2, axis=1)

    def weighted(o: jax.Array, ym: tuple) -> tuple:
        t, m = ym
        return jnp.sum(per_row(o, t) * m), jnp.sum(m)

    opt = optax.sgd(0.5)

    def made(loss: Any, **options: Any) -> pw.Pipeline:
        return pw.pipeline(
            [layer, layer, layer, head],
            slices,
            loss,
            opt,
            microbatches=4,
            batch_spec=PartitionSpec("data"),
            reduce_grads=reduce_grads,
            **options,
        )

    _, got = _train(made(weighted, clip_grad_norm=clip, weighted_loss=True), x, (y, mask), 4)

    def whole(ps: list[dict]) -> jax.Array:
        h = jnp.asarray(x)
        for f, p in zip([layer, layer, layer, head], ps, strict=True):
            h = f(p, h)
        return jnp.sum(per_row(h, y) * mask) / jnp.sum(mask)

    ref = optax.chain(optax.clip_by_global_norm(clip), opt) if clip else opt
    want, _ = _trained(whole, _params(SIZES), ref, 4)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)

    # Without it, the step's loss is the mean of the microbatches' masked means: another
    # number, for masks that hold different counts.
    def masked_mean(o: jax.Array, ym: tuple) -> jax.Array:
        total, count = weighted(o, ym)
        return total / count

    _, first = _train(made(masked_mean), x, (y, mask), 1)
    assert abs(first[0] - want[0]) > 1e-3 * want[0]


def _embed(p: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["t"].T + p["b"])


def _unembed(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["t"] + p["b"]


@pytest.mark.parametrize(
    ("reduce_grads", "clip"), [("microbatch", None), ("microbatch", 0.05), ("step", 0.05)]
)
def test_parameters_tied_across_stages_train_as_one_parameter_in_plain_jax(
    slices: list[pw.VirtualSlice], reduce_grads: str, clip: float | None
) -> None:
    """An embedding in the first stage reused as the last stage's output projection:
    each stage keeps a copy, and the copies train as the one parameter does in one
    program (and count once in the global gradient norm)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.standard_normal((64, 8)).astype(np.float32)
    table = (rng.standard_normal((32, 8)) / 4).astype(np.float32)
    mid = _params([32, 32, 32])
    params = [
        {"t": table, "b": np.zeros(32, np.float32)},
        *mid,
        {"t": np.zeros_like(table), "b": np.zeros(8, np.float32)},  # started from params[0]'s
    ]
    stages = [_embed, layer, layer, _unembed]
    opt = optax.adam(1e-2)
    step = pw.pipeline(
        stages,
        slices,
        mse,
        opt,
        microbatches=4,
        batch_spec=PartitionSpec("data"),
        reduce_grads=reduce_grads,
        clip_grad_norm=clip,
        tied=[((0, "t"), (3, "t"))],
    )
    assert "tied=[\"params[0]['t'] = params[3]['t']\"]" in repr(step)
    p, got = _train(step, x, y, 4, params)

    def whole(q: dict) -> jax.Array:
        h = _embed({"t": q["t"], "b": q["b0"]}, jnp.asarray(x))
        h = layer(q["m0"], h)
        h = layer(q["m1"], h)
        return mse(_unembed({"t": q["t"], "b": q["b3"]}, h), y)

    ref = optax.chain(optax.clip_by_global_norm(clip), opt) if clip else opt
    one = {"t": table, "b0": params[0]["b"], "m0": mid[0], "m1": mid[1], "b3": params[3]["b"]}
    want, q = _trained(whole, one, ref, 4)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    first, last_copy = np.asarray(p[0]["t"]), np.asarray(p[3]["t"])
    np.testing.assert_array_equal(first, last_copy)  # the copies stayed one parameter
    np.testing.assert_allclose(first, np.asarray(q["t"]), rtol=2e-5, atol=1e-6)


def test_tied_parameter_mistakes_are_named(slices: list[pw.VirtualSlice]) -> None:
    stages = [layer, layer, layer, head]
    opt = optax.sgd(0.1)
    with pytest.raises(TypeError, match="tied is a list of groups"):
        pw.pipeline(stages, slices, mse, opt, tied="w")
    with pytest.raises(ValueError, match=r"tied\[0\] must name two or more leaves"):
        pw.pipeline(stages, slices, mse, opt, tied=[((0, "w"),)])
    with pytest.raises(ValueError, match="stage 7 is not one of the 4 stages"):
        pw.pipeline(stages, slices, mse, opt, tied=[((0, "w"), (7, "w"))])
    with pytest.raises(ValueError, match="ties two leaves of one stage"):
        pw.pipeline(stages, slices, mse, opt, tied=[((1, "w"), (1, "b"))])
    step = pw.pipeline(stages, slices, mse, opt, tied=[((0, "w"), (3, "w"))])
    with pytest.raises(
        ValueError, match=r"one shape and dtype.*float32\[8, 32\].*float32\[32, 4\]"
    ):
        step.init(_params(SIZES))
    step = pw.pipeline(stages, slices, mse, opt, tied=[((1, "w"), (2, "kernel"))])
    with pytest.raises(ValueError, match=r"params\[2\] has no leaf at \['kernel'\]"):
        step.init(_params(SIZES))


def test_an_optimizer_that_needs_every_stages_gradients_is_refused(
    slices: list[pw.VirtualSlice],
) -> None:
    stages = [layer, layer, layer, head]
    for opt in (
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
        optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)), 2),
        optax.multi_transform(
            {"a": optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)), "b": optax.sgd(1)},
            {"w": "a", "b": "b"},
        ),
    ):
        with pytest.raises(ValueError, match=r"optax.clip_by_global_norm.*clip_grad_norm=\.\.\."):
            pw.pipeline(stages, slices, mse, opt)
    with pytest.raises(ValueError, match=r"optax.apply_if_finite.*skip_nonfinite=True"):
        pw.pipeline(stages, slices, mse, optax.apply_if_finite(optax.adam(1e-3), 3))
    for opt in (optax.lbfgs(), optax.contrib.prodigy(), optax.contrib.dog()):
        with pytest.raises(ValueError, match="norms or inner products over all the parameters"):
            pw.pipeline(stages, slices, mse, opt)
    with pytest.raises(TypeError, match="skip_nonfinite is True or False"):
        pw.pipeline(stages, slices, mse, optax.sgd(0.1), skip_nonfinite=1)  # type: ignore[arg-type]
    for bad, err in ((0.0, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(err, match="clip_grad_norm"):
            pw.pipeline(stages, slices, mse, optax.sgd(0.1), clip_grad_norm=bad)  # type: ignore[arg-type]
    # Transformations that work leaf by leaf, and wrappers around them, are taken.
    pw.pipeline(stages, slices, mse, optax.chain(optax.clip(1.0), optax.adamw(1e-3)))


def test_reduce_grads_errors_say_what_to_pass(slices: list[pw.VirtualSlice]) -> None:
    stages = [layer, layer, layer, head]
    opt = optax.sgd(0.1)
    with pytest.raises(ValueError, match=r"reduce_grads must be one of \('microbatch', 'step'\)"):
        pw.pipeline(stages, slices, mse, opt, reduce_grads="once")
    with pytest.raises(ValueError, match=r"batch_spec must name mesh axes for dimension 0"):
        pw.pipeline(stages, slices, mse, opt, reduce_grads="step")
    with pytest.raises(ValueError, match=r"dimension 0 only.*got P\(None, 'data'\)"):
        pw.pipeline(
            stages, slices, mse, opt, reduce_grads="step", batch_spec=PartitionSpec(None, "data")
        )


def test_a_stage_constraining_the_rows_reduce_grads_step_splits_is_told_why(
    slices: list[pw.VirtualSlice],
) -> None:
    def constrained(p: dict, x: jax.Array) -> jax.Array:
        return jax.lax.with_sharding_constraint(layer(p, x), PartitionSpec("data"))

    step = pw.pipeline(
        [constrained, layer, layer, head],
        slices,
        mse,
        optax.sgd(0.1),
        microbatches=4,
        batch_spec=PartitionSpec("data"),
        reduce_grads="step",
    )
    params, state = step.init(_params(SIZES))
    x, y = _batch()
    with pytest.raises(ValueError, match="Auto axes") as info:
        step(params, state, x, y)
    assert any("takes reduce_grads='microbatch'" in note for note in info.value.__notes__)


def test_a_pipeline_over_two_clients_slices_is_refused_when_built() -> None:
    with pw.InProcessCluster(islands=2, devices_per_island=1) as cluster:
        one, other = cluster.client(), cluster.client()
        a, b = one.allocate({"data": 1}), other.allocate({"data": 1})
        with pytest.raises(ValueError, match=r"slices\[1\] belong to another pw.Client"):
            pw.pipeline([layer, head], [a, b], mse, optax.sgd(0.1))
        assert one.pending() == other.pending() == 0  # nothing was launched


def test_pipeline_arguments_of_the_wrong_kind_are_named(slices: list[pw.VirtualSlice]) -> None:
    stages = [layer, layer, layer, head]
    opt = optax.sgd(0.1)
    with pytest.raises(TypeError, match=r"optax GradientTransformation.*got 'adam'"):
        pw.pipeline(stages, slices, mse, "adam")
    with pytest.raises(TypeError, match=r"stages\[1\] is \['dict'\]"):
        pw.pipeline([layer, {"w": 1}, layer, head], slices, mse, opt)
    with pytest.raises(TypeError, match=r"slices\[3\] is \['dict'\]"):
        pw.pipeline(stages, [*slices[:3], {"data": 2}], mse, opt)
    with pytest.raises(ValueError, match="one slice per stage: got 4 stages and 3 slices"):
        pw.pipeline(stages, slices[:3], mse, opt)
    with pytest.raises(TypeError, match="loss_fn is a function"):
        pw.pipeline(stages, slices, None, opt)
    with pytest.raises(TypeError, match=r"microbatches is a count, an int >= 1; got 2.5"):
        pw.pipeline(stages, slices, mse, opt, microbatches=2.5)
    with pytest.raises(TypeError, match=r"batch_spec is a PartitionSpec.*got 'data'"):
        pw.pipeline(stages, slices, mse, opt, batch_spec="data")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"remat is True or False; got 'yes'"):
        pw.pipeline(stages, slices, mse, opt, remat="yes")  # type: ignore[arg-type]
    step = pw.pipeline(stages, slices, mse, opt, microbatches=np.int64(8))
    names = [vs.name for vs in slices]
    assert repr(step) == (
        f"Pipeline(stages=['layer', 'layer', 'layer', 'head'], slices={names}, "
        "microbatches=8, schedule='1f1b', bubble_theoretical=0.273)"
    )


def test_batch_and_stage_mistakes_are_named_before_anything_runs(
    slices: list[pw.VirtualSlice],
) -> None:
    x, y = _batch()
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(0.1), microbatches=4)
    params, state = step.init(_params(SIZES))
    # Parameters or optimizer state for the wrong number of stages.
    with pytest.raises(ValueError, match=r"params must hold one entry per stage \(4\); got 2"):
        step(params[:2], state, x, y)
    with pytest.raises(ValueError, match=r"opt_state must hold one entry per stage.*dict"):
        step(params, {"mu": state}, x, y)
    # Labels for half the rows would broadcast in the loss without a word.
    with pytest.raises(ValueError, match=r"x has 64 rows and y 16"):
        step(params, state, x, y[:16])
    # Rows that microbatches do not divide, from NumPy or already on the slices.
    for xb, yb in ((x[:62], y[:62]), (slices[0].put(x[:62]), slices[-1].put(y[:62]))):
        with pytest.raises(ValueError, match=r"62 rows, which do not split into microbatches=4"):
            step(params, state, xb, yb)
    # Microbatches that batch_spec cannot split over a slice's devices.
    split = pw.pipeline(
        [layer, layer, layer, head],
        slices,
        mse,
        optax.sgd(0.1),
        microbatches=4,
        batch_spec=PartitionSpec("data"),
    )
    sp, ss = split.init(_params(SIZES))
    with pytest.raises(ValueError, match=r"each of its microbatches=4 has 15.*multiple of 8"):
        split(sp, ss, x[:60], y[:60])
    # A stage whose parameters do not fit its input: JAX's error, naming the stage.
    bad = _params(SIZES)
    bad[2] = jax.tree.map(lambda a: a[:-1] if a.ndim == 2 else a, bad[2])
    params, state = step.init(bad)
    with pytest.raises(TypeError, match="dot_general") as info:
        step(params, state, x, y)
    assert any("'stage2:layer.fwd'" in note for note in info.value.__notes__)


def test_batches_already_on_the_slices_split_there_with_one_program_each(
    four: pw.Client, slices: list[pw.VirtualSlice]
) -> None:
    x, y = _batch()
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.adam(1e-2), microbatches=8)
    xr = slices[0].put(x, PartitionSpec("data"))
    yr = slices[-1].put(y, PartitionSpec("data"))
    _, got = _train(step, xr, yr, 3)
    np.testing.assert_allclose(got, _reference(_params(SIZES), x, y, 3), rtol=2e-5, atol=1e-6)
    # One split program per slice, traced once: not a new program every step.
    assert sorted(repr(f) for f in step._splits.values()) == ["<pw.jit split (1 programs)>"] * 2

    # Rows split over the devices: each device cuts its own, and a batch from NumPy is
    # cut the same way, so x and y keep their rows together either way.
    rows = pw.pipeline(
        [layer, layer, layer, head],
        slices,
        mse,
        optax.adam(1e-2),
        microbatches=8,
        batch_spec=PartitionSpec("data"),
    )
    for batch, vs in ((x, slices[0]), (y, slices[-1])):
        on_slice = rows._split(vs.put(batch, PartitionSpec("data")), vs)
        from_numpy = rows._split(batch, vs)
        for a, b in zip(pw.fetch(on_slice), pw.fetch(from_numpy), strict=True):
            np.testing.assert_array_equal(a, b)
        assert not np.array_equal(pw.fetch(on_slice[1]), batch[len(batch) // 8 :][:8])
    _, got = _train(rows, xr, yr, 3)
    np.testing.assert_allclose(got, _reference(_params(SIZES), x, y, 3), rtol=2e-5, atol=1e-6)


def test_init_places_parameters_on_their_stage_and_refuses_shared_arrays(
    slices: list[pw.VirtualSlice],
) -> None:
    x, y = _batch()
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.adam(1e-2), microbatches=8)
    raw = _params(SIZES)
    with pytest.raises(ValueError, match=r"params must hold one entry per stage \(4\); got <cl"):
        step.init(dict(enumerate(raw)))  # type: ignore[arg-type]
    # A parameter already on another stage's slice is moved to its own stage.
    elsewhere = [dict(p) for p in raw]
    elsewhere[1]["w"] = slices[3].put(raw[1]["w"])
    params, state = step.init(elsewhere)
    assert [p["w"].slice for p in params] == slices
    params, state, loss = step(params, state, x, y)
    np.testing.assert_allclose(float(loss), _reference(raw, x, y, 1)[0], rtol=2e-5)
    # One array as two stages' parameters: the first update would donate it from under
    # the second, so neither init nor a step takes it.
    shared = slices[1].put(raw[1]["w"])
    tied = [dict(p) for p in raw]
    tied[1]["w"] = tied[2]["w"] = shared
    with pytest.raises(ValueError, match=r"params\[1\]\['w'\] and params\[2\]\['w'\] are one"):
        step.init(tied)
    params[2]["w"] = params[1]["w"]
    with pytest.raises(ValueError, match="are one RemoteArray"):
        step(params, state, x, y)
    assert not params[1]["w"].is_deleted()  # refused before anything was donated


def test_pytree_batches_split_leaf_by_leaf_and_train_like_plain_jax(
    slices: list[pw.VirtualSlice],
) -> None:
    x, y = _batch()
    mask = (np.arange(64 * SIZES[-1]).reshape(64, SIZES[-1]) % 3 != 0).astype(np.float32)

    def first(p: dict, inputs: dict) -> jax.Array:
        return layer(p, inputs["features"] * inputs["scale"][:, None])

    def masked(out: jax.Array, target: tuple) -> jax.Array:
        labels, weights = target
        return jnp.mean(((out - labels) ** 2) * weights)

    def reference(ps: list[dict]) -> jax.Array:
        h = first(ps[0], {"features": x, "scale": np.full(64, 0.5, np.float32)})
        for f, p in zip([layer, layer, head], ps[1:], strict=True):
            h = f(p, h)
        return masked(h, (y, mask))

    step = pw.pipeline([first, layer, layer, head], slices, masked, optax.sgd(0.5), microbatches=4)
    params, state = step.init(_params(SIZES))
    inputs = {"features": x, "scale": slices[0].put(np.full(64, 0.5, np.float32))}
    target = (y, mask)  # two leaves: 2 would have passed as a row count before
    ps, want = jax.tree.map(jnp.asarray, _params(SIZES)), []
    opt = optax.sgd(0.5)
    st = opt.init(ps)
    got = []
    for _ in range(3):
        params, state, loss = step(params, state, inputs, target)
        got.append(loss)
        v, g = jax.value_and_grad(reference)(ps)
        upd, st = opt.update(g, st, ps)
        ps = optax.apply_updates(ps, upd)
        want.append(float(v))
    np.testing.assert_allclose([float(v) for v in pw.fetch(got)], want, rtol=2e-5, atol=1e-6)
    with pytest.raises(
        ValueError, match=r"y's leaves have different numbers of rows .*y\[1\]': 32"
    ):
        step(params, state, inputs, (y, mask[:32]))
    with pytest.raises(ValueError, match=r"x holds no arrays \(got dict\)"):
        step(params, state, {}, target)


def test_stages_run_at_the_same_time(four: pw.Client, slices: list[pw.VirtualSlice]) -> None:
    # Programs long enough (tens of ms) that a sequential runtime could not hide it.
    width = 1024
    rng = np.random.default_rng(3)
    x = rng.standard_normal((512, width)).astype(np.float32)
    y = rng.standard_normal((512, width)).astype(np.float32)
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(1e-3), microbatches=8)
    params, state = step.init(_params([width] * 5))
    params, state, loss = step(params, state, x, y)  # compiles
    float(loss)
    four.wait_all()
    since = time.time()
    params, state, loss = step(params, state, x, y)
    float(loss)
    four.wait_all()
    ev = four.events(since=since)
    runs = ev[ev.kind.isin(["start", "end"]) & ev.program.str.startswith("stage")]
    spans = runs.pivot_table(index="lid", columns="kind", values="time", aggfunc="first")
    spans["stage"] = runs.groupby("lid").program.first().str.split(":").str[0]
    rows = list(spans.itertuples())
    overlaps = sum(
        1
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if a.stage != b.stage and a.start < b.end and b.start < a.end
    )
    assert overlaps >= 4, spans.sort_values("start")
    bubble = step.bubble(ev)
    assert set(bubble["per_stage"]) == {0, 1, 2, 3}
    assert 0.0 <= bubble["mean"] < 1.0 and bubble["theoretical"] == pytest.approx(3 / 11)
    # Each stage's busy time is the sum of its programs' (they do not overlap within a
    # stage). The replay with each kind's median program time may idle more or less than
    # the step did (its programs' times spread on two busy cores), but it is a fraction.
    for s, busy in bubble["busy_s"].items():
        assert busy == pytest.approx((1 - bubble["per_stage"][s]) * bubble["span_s"])
    assert 0.0 <= bubble["scheduled"] < 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"extra_warmup": -1}, r"extra_warmup is a count of forwards, an int >= 0; got -1"),
        ({"extra_warmup": "1"}, r"an int >= 0; got '1'"),
        ({"extra_warmup": True}, r"an int >= 0; got True"),
        (
            {"extra_warmup": 1, "schedule": "gpipe"},
            r"extra_warmup applies to the 1f1b schedule; 'gpipe' runs every forward",
        ),
    ],
)
def test_extra_warmup_errors_say_what_to_pass(
    slices: list[pw.VirtualSlice], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(0.1), **kwargs)


@pytest.mark.parametrize("program", ["stage2:layer.fwd", "stage2:layer.bwd", "stage2:layer.update"])
def test_a_failure_in_stage_two_reaches_the_loss(
    four: pw.Client, slices: list[pw.VirtualSlice], program: str
) -> None:
    """Its forward, its backward (which the loss does not read) or its update (which
    runs after the loss is known): the step's loss fails with the cause."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 4)).astype(np.float32)
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.sgd(1e-2), microbatches=4)
    params, state = step.init(_params([8, 16, 16, 16, 4]))
    four.inject_fault(slices[2], match=program)
    params, state, loss = step(params, state, x, y)
    with pytest.raises(pw.RemoteError, match="injected fault") as info:
        float(loss)
    assert info.value.program == program


def test_an_interrupt_while_a_step_is_submitted_leaves_the_state_whole(
    four: pw.Client, slices: list[pw.VirtualSlice]
) -> None:
    """The step's updates donate the old parameters: a Ctrl-C between two of its launches
    left stage 0 updated and the others never, with nothing whole to go on from."""
    import signal

    x, y = _batch()
    want = _reference(_params(SIZES), x, y, 2)
    step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.adam(1e-2), microbatches=4)
    params, state = step.init(_params(SIZES))
    params, state, first = step(params, state, x, y)
    update = step._update[1]
    original = update.__call__

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        # As "interrupt kernel" while the step submits its second stage's update.
        signal.raise_signal(signal.SIGINT)
        return original(*args, **kwargs)

    step._update[1] = interrupted  # type: ignore[assignment,index]
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            step(params, state, x, y)
    finally:
        step._update[1] = update
    assert any("step.last" in note for note in info.value.__notes__)
    assert step.last is not None
    params, state, second = step.last
    np.testing.assert_allclose([float(first), float(second)], want, rtol=2e-5)
    step(params, state, x, y)  # training goes on from it


def test_training_goes_on_from_a_checkpoint_after_a_stage_host_restarts() -> None:
    """A stage's host dies mid-training: the step fails with DataLossError, the restarted
    host takes the stage's slice back, and the same step function, given the checkpoint
    put back on the slices, trains on to the losses plain JAX gives without the failure."""
    x, y = _batch()
    want = _reference(_params(SIZES), x, y, 6)
    with pw.InProcessCluster(4, 2) as c, c.client() as client:
        slices = [client.allocate({"data": 2}) for _ in range(4)]
        step = pw.pipeline(
            [layer, layer, layer, head], slices, mse, optax.adam(1e-2), microbatches=4
        )
        params, state = step.init(_params(SIZES))
        losses = []
        for _ in range(3):
            params, state, loss = step(params, state, x, y)
            losses.append(float(loss))
        checkpoint = pw.fetch((params, state))
        victim = slices[2]
        c.controller.host_lost(victim.host, "test")
        deadline = time.monotonic() + 10
        while victim.state != "lost" and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pw.DataLossError):
            float(step(params, state, x, y)[2])
        c.restart_host([h.name for h in c.hosts].index(victim.host))
        victim.wait_active(timeout=10)
        params = [s.put(p) for s, p in zip(slices, checkpoint[0], strict=True)]
        state = [s.put(st) for s, st in zip(slices, checkpoint[1], strict=True)]
        for _ in range(3):
            params, state, loss = step(params, state, x, y)
            losses.append(float(loss))
    np.testing.assert_allclose(losses, want, rtol=2e-5, atol=1e-6)


def test_closing_with_a_steps_work_in_flight_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    x, y = _batch()
    for _ in range(3):
        with (
            caplog.at_level(logging.INFO, logger="pathways_nb"),
            pw.InProcessCluster(islands=4, devices_per_island=2) as cluster,
        ):
            client = cluster.client()
            slices = [client.allocate({"data": 2}) for _ in range(4)]
            step = pw.pipeline([layer, layer, layer, head], slices, mse, optax.adam(1e-2))
            params, state = step.init(_params(SIZES))
            for _ in range(3):
                params, state, loss = step(params, state, x, y)
            float(loss)  # the updates and their transfers are still in flight
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert not loud, [r.getMessage() for r in loud]
