"""What :func:`pathways_nb.pipeline` and a pipeline step refuse, before anything is
traced or sent, each with what to pass instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pathways_nb.client._remote import RemoteArray

REDUCE_GRADS = ("microbatch", "step")


def check_per_stage(what: str, given: Any, n: int, hint: str) -> None:
    if not isinstance(given, (list, tuple)) or len(given) != n:
        got = f"{len(given)} items" if isinstance(given, (list, tuple)) else type(given)
        raise ValueError(f"{what} must hold one entry per stage ({n}); got {got}. Pass {hint}")


def check_own_arrays(params: Sequence[Any]) -> None:
    """Refuse one RemoteArray in two places of the parameters: a step donates every
    stage's parameters when it updates them, so the second use would find it gone."""
    seen: dict[int, str] = {}
    for s, tree in enumerate(params):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if not isinstance(leaf, RemoteArray):
                continue
            where = f"params[{s}]{jax.tree_util.keystr(path)}"
            first = seen.setdefault(id(leaf), where)
            if first != where:
                raise ValueError(
                    f"{first} and {where} are one RemoteArray; each stage's update donates "
                    "its parameters, so every parameter must be an array of its own. Pass a "
                    "copy (vs.put(x) on the stage's slice, or copy.deepcopy); parameters "
                    "tied across stages are not shared by a pipeline"
                )


def check_arguments(
    stages: Sequence[Any],
    slices: Sequence[Any],
    loss_fn: Any,
    optimizer: Any,
    microbatches: Any,
    batch_spec: Any = None,
    remat: Any = False,
) -> None:
    """Refuse what cannot make a pipeline before anything is traced, saying what to pass."""
    from pathways_nb.client._slice import VirtualSlice

    bad = [i for i, fn in enumerate(stages) if not callable(fn)]
    if bad:
        raise TypeError(
            f"stages are functions stage(params, x) -> activation; stages{bad} "
            f"{'is' if len(bad) == 1 else 'are'} {[type(stages[i]).__name__ for i in bad]}"
        )
    bad = [i for i, vs in enumerate(slices) if not isinstance(vs, VirtualSlice)]
    if bad:
        raise TypeError(
            "slices are VirtualSlices from client.allocate(...), one per stage; "
            f"slices{bad} {'is' if len(bad) == 1 else 'are'} "
            f"{[type(slices[i]).__name__ for i in bad]}"
        )
    if len(stages) != len(slices):
        raise ValueError(f"one slice per stage: got {len(stages)} stages and {len(slices)} slices")
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn is a function loss_fn(output, y) -> scalar; got {type(loss_fn).__name__}"
        )
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "optimizer is an optax GradientTransformation (init and update), e.g. "
            f"optax.adam(1e-3); got {optimizer!r}"
        )
    if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)):
        raise TypeError(f"microbatches is a count, an int >= 1; got {microbatches!r}")
    if batch_spec is not None and not isinstance(batch_spec, PartitionSpec):
        raise TypeError(
            "batch_spec is a PartitionSpec over the slices' axes for each microbatch, e.g. "
            f"PartitionSpec('data'); got {batch_spec!r}"
        )
    if not isinstance(remat, bool):
        raise TypeError(f"remat is True or False; got {remat!r}")


def row_axes(batch_spec: PartitionSpec, reduce_grads: str) -> Any:
    """The mesh axes each microbatch's rows are split over, when every device keeps its
    own gradient sum (``reduce_grads="step"``); None when gradients are reduced per
    microbatch."""
    if reduce_grads not in REDUCE_GRADS:
        raise ValueError(f"reduce_grads must be one of {REDUCE_GRADS}; got {reduce_grads!r}")
    if reduce_grads == "microbatch":
        return None
    axes = batch_spec[0] if len(batch_spec) else None
    if axes is None or any(a is not None for a in batch_spec[1:]):
        raise ValueError(
            "reduce_grads='step' splits each microbatch's rows over the slices' devices "
            f"and nothing else; batch_spec must name mesh axes for dimension 0 only, "
            f"e.g. PartitionSpec('data'); got {batch_spec}"
        )
    return axes
