"""The programs of one pipeline stage, built from the user's stage function.

Forward (returning its own residuals, or nothing extra under remat), backward (from those
residuals, or recomputing the forward), the last stage's fused forward, loss and backward,
and the optimizer update. Each backward comes in two forms: one that starts the parameter
gradients and one that adds to them (the accumulator is donated).

``per_device`` wraps a stage's forward and backward (and ``last`` its program, given
``rows``) so that each device of the slice works on its own rows of the microbatch and
keeps its own sum of parameter gradients, as data-parallel training does: the slice's
devices reduce the gradients once per step, in the update (``reduce_then``), instead of
once per microbatch. That is exact only for stages that treat
rows independently (no statistics across the batch inside the stage), so it is asked for
explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from pathways_nb.client._export import laid_out
from pathways_nb.client._ties import Path, leaf_at, with_leaf


def _added(a: Any, b: Any) -> Any:
    return jax.tree.map(lambda u, v: u + v, a, b)


def _stacked(tree: Any) -> Any:
    """Each leaf as one device's row of a per-device stack."""
    return jax.tree.map(lambda v: v[None], tree)


def _unstacked(tree: Any) -> Any:
    """This device's row of each per-device stack."""
    return jax.tree.map(lambda v: v[0], tree)


def backward(fn: Callable[[Any, Any], Any], first_stage: bool) -> tuple[Any, Any]:
    """Backward of a middle stage, recomputing its forward; with and without an
    accumulator for the parameter gradients."""

    def grads(p: Any, x: Any, g: Any) -> tuple[Any, Any]:
        _, vjp = jax.vjp(fn, p, x)
        gp, gx = vjp(g)
        return gp, gx

    def first(p: Any, x: Any, g: Any) -> Any:
        gp, gx = grads(p, x, g)
        return gp if first_stage else (gp, gx)

    def acc(p: Any, x: Any, g: Any, a: Any) -> Any:
        gp, gx = grads(p, x, g)
        total = _added(a, gp)
        return total if first_stage else (total, gx)

    first.__name__ = acc.__name__ = getattr(fn, "__name__", "stage")
    return first, acc


def residuals(
    fn: Callable[[Any, Any], Any], p: Any, x: Any
) -> tuple[Any, Any, list[Any], list[Any]]:
    """The stage's output, its vjp, the vjp's leaves and where each comes from: an input
    leaf ``("in", i)``, an output leaf ``("out", i)``, an earlier residual
    ``("same", k)`` or a residual of its own ``("res", None)``.

    The vjp keeps whatever the backward needs, inputs and output included; returned
    from a program, each would be a copy (the weights once per microbatch).
    """
    out, vjp = jax.vjp(fn, p, x)
    ins, outs = jax.tree.leaves((p, x)), jax.tree.leaves(out)
    leaves = jax.tree.leaves(vjp)
    where: list[Any] = []
    for k, leaf in enumerate(leaves):
        src: Any = ("res", None)
        for tag, pool in (("in", ins), ("out", outs), ("same", leaves[:k])):
            j = next((j for j, a in enumerate(pool) if a is leaf), None)
            if j is not None:
                src = (tag, j)
                break
        where.append(src)
    return out, vjp, leaves, where


def with_residuals(fn: Callable[[Any, Any], Any]) -> Any:
    def forward(p: Any, x: Any) -> tuple[Any, tuple[Any, ...]]:
        out, _, leaves, where = residuals(fn, p, x)
        return out, tuple(leaf for leaf, src in zip(leaves, where, strict=True) if src[0] == "res")

    forward.__name__ = getattr(fn, "__name__", "stage")
    return forward


def backward_from_residuals(fn: Callable[[Any, Any], Any], first_stage: bool) -> tuple[Any, Any]:
    """Backward of a middle stage from the residuals its forward returned.

    The stage is traced again here only for the vjp's structure: nothing of that trace
    but the inputs and the output reaches the result, so the compiler drops it.
    """

    def grads(p: Any, x: Any, out: Any, kept: tuple[Any, ...], g: Any) -> tuple[Any, Any]:
        _, vjp, _, where = residuals(fn, p, x)
        ins, outs = jax.tree.leaves((p, x)), jax.tree.leaves(out)
        own = iter(kept)
        leaves: list[Any] = []
        for tag, j in where:
            if tag == "in":
                leaves.append(ins[j])
            elif tag == "out":
                leaves.append(outs[j])
            elif tag == "same":
                leaves.append(leaves[j])
            else:
                leaves.append(next(own))
        gp, gx = jax.tree.unflatten(jax.tree.structure(vjp), leaves)(g)
        return gp, gx

    def first(p: Any, x: Any, out: Any, kept: tuple[Any, ...], g: Any) -> Any:
        gp, gx = grads(p, x, out, kept, g)
        return gp if first_stage else (gp, gx)

    def acc(p: Any, x: Any, out: Any, kept: tuple[Any, ...], g: Any, a: Any) -> Any:
        gp, gx = grads(p, x, out, kept, g)
        total = _added(a, gp)
        return total if first_stage else (total, gx)

    first.__name__ = acc.__name__ = getattr(fn, "__name__", "stage")
    return first, acc


def last(
    fn: Callable[[Any, Any], Any],
    loss_fn: Callable[[Any, Any], Any],
    m: float,
    only: bool,
    rows: tuple[AbstractMesh, Any] | None = None,
    weighted: bool = False,
) -> tuple[Any, Any]:
    """The last stage: forward, loss (divided by the microbatch count, so gradients
    add up to the batch mean) and backward in one program.

    With ``weighted`` the loss is a pair (sum of the microbatch's losses, their weight):
    the program differentiates the sum alone and the step adds both up, pair by pair;
    the update divides the gradients by the total weight (``update``'s ``weight``), as
    the gradient of sum/weight over the whole batch is.

    With ``rows`` (a mesh and the axes dimension 0 is split over) the stage runs on each
    device's own rows and its parameter gradients come back as per-device sums, one row
    per device; the loss is still taken over the whole microbatch.
    """

    def value_and_grads(p: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        if rows is None:
            stage, at = fn, p
        else:
            # Differentiating with respect to one copy of the parameters per device
            # leaves each device's gradient its own (with respect to the replicated
            # parameters, the devices' contributions would be added up here).
            stage, at = _on_own_rows(fn, *rows), _per_device_copies(p, *rows)

        def objective(pp: Any, xx: Any) -> Any:
            out = loss_fn(stage(pp, xx), y)
            if weighted:
                total, weight = _weighted_loss(out)
                return total, weight
            return _scalar_loss(out) / m

        grads = jax.value_and_grad(objective, argnums=(0, 1), has_aux=weighted)
        if weighted:
            (total, weight), (gp, gx) = grads(at, x)
            return (total, weight), gp, gx
        loss, (gp, gx) = grads(at, x)
        return loss, gp, gx

    def first(p: Any, x: Any, y: Any) -> Any:
        loss, gp, gx = value_and_grads(p, x, y)
        return loss, gp, (None if only else gx)

    def acc(p: Any, x: Any, y: Any, a: Any, total: Any) -> Any:
        loss, gp, gx = value_and_grads(p, x, y)
        return _added(total, loss), _added(a, gp), (None if only else gx)

    return first, acc


def _scalar_loss(value: Any) -> Any:
    """The loss, refused unless it is a float scalar (jax.grad's rule for what it
    differentiates), with what the pipeline takes instead."""
    if _is_float_scalar(value):
        return value
    raise TypeError(
        f"loss_fn(output, y) returns the microbatch's loss as a float scalar (its mean over "
        f"the rows); it returned {_described(value)}. A vector of losses wants a mean; "
        "(loss, metrics) is not carried through the pipeline: return the loss alone and "
        "compute the metrics with a pw.jit of their own"
    )


def _weighted_loss(value: Any) -> tuple[Any, Any]:
    """A weighted loss (sum, weight), refused unless it is a float scalar and a scalar;
    the weight is data (a count of rows or tokens), so no gradient flows through it."""
    if isinstance(value, tuple | list) and len(value) == 2:
        total, weight = value
        if _is_float_scalar(total) and np.shape(weight) == ():
            return total, jax.lax.stop_gradient(jnp.asarray(weight, dtype=total.dtype))
    raise TypeError(
        "with weighted_loss=True, loss_fn(output, y) returns a pair (sum of the "
        "microbatch's losses, their weight) of scalars, e.g. (jnp.sum(loss * mask), "
        f"jnp.sum(mask)); it returned {_described(value)}"
    )


def _is_float_scalar(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return (
        getattr(value, "shape", None) == ()
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.inexact)
    )


def _described(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"({', '.join(_described(v) for v in value)})"
    shape = getattr(value, "shape", None)
    return type(value).__name__ if shape is None else f"{value.dtype}{list(shape)}"


def _on_own_rows(fn: Callable[[Any, Any], Any], mesh: AbstractMesh, axes: Any) -> Any:
    """``fn(per-device params, x)``: each device applies ``fn`` with its own copy of the
    parameters to its own rows."""
    rows = PartitionSpec(axes)

    def body(q: Any, x: Any) -> Any:
        return fn(_unstacked(q), x)

    def stage(q: Any, x: Any) -> Any:
        return jax.shard_map(
            body, mesh=mesh, in_specs=(rows, rows), out_specs=rows, check_vma=False
        )(q, x)

    return stage


def _per_device_copies(p: Any, mesh: AbstractMesh, axes: Any) -> Any:
    names = axes if isinstance(axes, tuple) else (axes,)
    n = math.prod(mesh.shape[a] for a in names)
    where = NamedSharding(mesh, PartitionSpec(axes))
    return jax.tree.map(lambda v: laid_out(jnp.broadcast_to(v, (n, *v.shape)), where), p)


def update(
    optimizer: Any, clip_norm: float | None = None, skip_nonfinite: bool = False
) -> Callable[..., tuple[Any, Any]]:
    """The stage's update. With ``clip_norm`` or ``skip_nonfinite`` it also takes every
    stage's ``gradient_share`` (this one's among them): with ``clip_norm`` it first clips
    the gradients to the global norm of all of them, as ``optax.clip_by_global_norm``
    clips one model's; with ``skip_nonfinite`` it keeps the parameters and optimizer
    state as they were when any stage's gradients are not all finite."""

    def update(p: Any, st: Any, g: Any, shares: Any = (), weight: Any = None) -> tuple[Any, Any]:
        import optax

        if weight is not None:
            g = _divided(g, weight)
        if clip_norm is not None:
            g = _clipped(g, [sq for sq, _ in shares], clip_norm)
        updates, new_st = optimizer.update(g, st, p)
        new_p = optax.apply_updates(p, updates)
        if skip_nonfinite:
            finite = jnp.all(jnp.stack([ok for _, ok in shares]))
            new_p = _kept_unless(finite, new_p, p)
            new_st = _kept_unless(finite, new_st, st)
        return new_p, new_st

    return update


def gradient_share(
    mesh: AbstractMesh | None = None, uncounted: Sequence[Path] = ()
) -> Callable[..., Any]:
    """What a stage tells the others of its gradient sum: its squared L2 norm, as
    ``optax.tree.norm`` takes it, and whether every entry is finite; with ``mesh``, of
    per-device sums (``per_device``), added up first as the update adds them
    (``reduce_then``). The leaves at ``uncounted`` (tied leaves another stage counts)
    are left out of the norm."""

    def share(g: Any, weight: Any = None) -> Any:
        import optax

        if mesh is not None:
            g = _reduced(g, mesh)
        if weight is not None:
            g = _divided(g, weight)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in jax.tree.leaves(g)]))
        for path in uncounted:
            g = with_leaf(g, path, jnp.zeros_like(leaf_at(g, path)))
        return optax.tree.norm(g, squared=True), finite

    return share


def _clipped(g: Any, squared_norms: list[Any], max_norm: float) -> Any:
    # optax.clip_by_global_norm's arithmetic, on the norm of all the stages' gradients.
    g_norm = jnp.sqrt(sum(squared_norms))
    keep = g_norm < max_norm
    return jax.tree.map(
        lambda t: jax.lax.select(keep, t, (t / g_norm.astype(t.dtype)) * max_norm), g
    )


def _divided(g: Any, weight: Any) -> Any:
    return jax.tree.map(lambda t: t / weight.astype(t.dtype), g)


def _kept_unless(take_new: Any, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.where(take_new, a, b), new, old)


def per_device(
    forward: Any,
    first: Any,
    acc: Any,
    remat: bool,
    first_stage: bool,
    mesh: AbstractMesh,
    axes: Any,
) -> tuple[Any, Any, Any]:
    """The stage's forward, first backward and accumulating backward, each run by every
    device of ``mesh`` on its own rows (dimension 0, split over ``axes``).

    What a device keeps for itself (its residuals, its gradient sum) travels as one
    global array with a new leading dimension split over ``axes``, one row per device.
    The parameters (the first argument) come in replicated.
    """
    rows, own = PartitionSpec(axes), PartitionSpec()
    name = getattr(forward, "__name__", "stage")

    def local(fn: Any, nargs: int, mine: tuple[int, ...], out_specs: Any, wrap: Any) -> Any:
        """``fn`` on each device's rows; the arguments at ``mine`` are per-device stacks."""

        def body(*args: Any) -> Any:
            return wrap(fn(*(_unstacked(v) if i in mine else v for i, v in enumerate(args))))

        def run(*args: Any) -> Any:
            # No varying-value checks: each device's gradient of the replicated
            # parameters must stay its own (a checked map would add them up here).
            return jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(own,) + (rows,) * (nargs - 1),
                out_specs=out_specs,
                check_vma=False,
            )(*args)

        run.__name__ = name
        return run

    def grads(r: Any) -> Any:
        return _stacked(r) if first_stage else (_stacked(r[0]), r[1])

    grads_out = rows if first_stage else (rows, rows)
    kept: tuple[int, ...]
    if remat:
        # (params, input, cotangent[, sums])
        fwd = local(forward, 2, (), rows, lambda r: r)
        n, kept = 3, ()
    else:
        # (params, input, output, residuals, cotangent[, sums])
        fwd = local(forward, 2, (), (rows, rows), lambda r: (r[0], _stacked(r[1])))
        n, kept = 5, (3,)
    bwd_first = local(first, n, kept, grads_out, grads)
    bwd_acc = local(acc, n + 1, (*kept, n), grads_out, grads)
    return fwd, bwd_first, bwd_acc


def reduce_then(update_fn: Any, mesh: AbstractMesh) -> Any:
    """The update for per-device gradient sums: add the devices' sums (the step's one
    reduction), replicated like the parameters, then update."""

    def update_reduced(p: Any, st: Any, g: Any, *extra: Any) -> Any:
        return update_fn(p, st, _reduced(g, mesh), *extra)

    return update_reduced


def _reduced(g: Any, mesh: AbstractMesh) -> Any:
    """Per-device gradient sums (a leading dimension, one row per device) added up,
    replicated like the parameters."""
    return jax.tree.map(
        lambda v: laid_out(v.sum(0), NamedSharding(mesh, PartitionSpec())),
        g,
    )


def done_token(leaf: Any) -> jax.Array:
    """A stage's word that its update ran: a scalar made from one of the new parameters
    (compiled with ``keep_unused``), which fails with the update's error when it failed."""
    del leaf
    return jnp.zeros((), jnp.int8)


def loss_after(loss: Any, *tokens: Any) -> Any:
    """The step's loss, once every stage's update has run (``tokens``, compiled with
    ``keep_unused``): a backward or update that failed on any stage fails the loss with
    its error, as a failed forward does."""
    del tokens
    return loss


def cut_microbatches(batch: Any, microbatches: int, blocks: int = 1) -> tuple[Any, ...]:
    """``batch``'s rows (dimension 0) as ``microbatches`` arrays of equal rows.

    The rows are taken as ``blocks`` equal blocks, and microbatch ``i`` is the ``i``-th
    part of every block, in block order: each device of a batch split over ``blocks``
    devices cuts its own rows, as data-parallel ranks cut their local batch, so cutting
    moves nothing between devices (a contiguous cut would move all but one part of
    each microbatch). With ``blocks=1`` microbatch ``i`` is the ``i``-th run of rows.

    >>> [m.tolist() for m in cut_microbatches(np.arange(8), 2, blocks=2)]
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    rows = batch.shape[0] // (microbatches * blocks)
    parts = batch.reshape(blocks, microbatches, rows, *batch.shape[1:])
    return tuple(parts[:, i].reshape(blocks * rows, *batch.shape[1:]) for i in range(microbatches))


def loss_ratio(total: Any, weight: Any) -> Any:
    """A weighted loss: the microbatches' loss sums over their total weight."""
    return total / weight
