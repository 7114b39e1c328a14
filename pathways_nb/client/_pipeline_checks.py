"""What :func:`pathways_nb.pipeline` and a pipeline step refuse, before anything is
traced or sent, each with what to pass instead."""

from __future__ import annotations

import inspect
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
                    "copy (vs.put(x) on the stage's slice, or copy.deepcopy); a parameter "
                    "that two stages share is a copy on each, named in pw.pipeline(tied=...)"
                )


def check_trainable(params: Sequence[Any]) -> None:
    """Refuse a parameter that is not a float (or complex) array: a pipeline trains
    every leaf of every stage's parameters, and the gradient of an integer or boolean
    one is a float0 that holds no values (``jax.grad`` refuses such inputs)."""
    for s, tree in enumerate(params):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            dtype = getattr(leaf, "dtype", None)
            if dtype is None:
                dtype = np.asarray(leaf).dtype
            if not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
                raise TypeError(
                    f"params[{s}]{jax.tree_util.keystr(path)} is {dtype}: a pipeline trains "
                    "every leaf of its stages' parameters, and only float (or complex) ones "
                    "have gradients. Keep integer or boolean state out of the parameters: "
                    "close over it in the stage function, or pass it with the batch"
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
    others = [i for i, vs in enumerate(slices) if vs._client is not slices[0]._client]
    if others:
        raise ValueError(
            f"a pipeline's slices are one client's, as its arrays move between them; "
            f"slices{others} belong to another pw.Client than slices[0]: allocate every "
            "stage's slice from the same client"
        )
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
    check_flag("remat", remat)


def check_flag(name: str, value: Any) -> None:
    """Refuse an on/off option that is not a bool (1, "yes")."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} is True or False; got {value!r}")


def check_clip(clip_grad_norm: Any) -> float | None:
    """``clip_grad_norm`` as a float, or None; refuse anything but a positive number."""
    if clip_grad_norm is None:
        return None
    if isinstance(clip_grad_norm, bool) or not isinstance(
        clip_grad_norm, int | float | np.integer | np.floating
    ):
        raise TypeError(
            f"clip_grad_norm is the global gradient norm to clip to, a number > 0 (or None); "
            f"got {clip_grad_norm!r}"
        )
    value = float(clip_grad_norm)
    if not (value > 0 and np.isfinite(value)):
        raise ValueError(
            f"clip_grad_norm must be a finite number > 0 (or None not to clip); got {value}"
        )
    return value


# optax transformations that reduce over the whole gradient tree: in a pipeline they
# would see one stage's gradients, and train differently from the same model in one
# program without saying so.
_GLOBAL_STEP = (
    "computes its step from norms or inner products over all the parameters, and each "
    "stage's optimizer is given that stage's alone, so the pipeline would train "
    "differently from the same model in one program; a pipeline takes optimizers that "
    "work leaf by leaf (sgd, adam, adamw, lion, adafactor, ...)"
)
_WHOLE_TREE = {
    "clip_by_global_norm": (
        "clips by the norm of the gradients it is given, and each stage's optimizer is "
        "given that stage's alone; pass clip_grad_norm=... to pw.pipeline instead (the "
        "norm of all stages' gradients) and leave it out of the optimizer"
    ),
    "apply_if_finite": (
        "checks the gradients it is given, and each stage's optimizer is given that "
        "stage's alone (a NaN on one stage would skip that stage's update and not the "
        "others'); pass skip_nonfinite=True to pw.pipeline instead (a step is skipped on "
        "every stage when any stage's gradients are not finite)"
    ),
    **dict.fromkeys(
        (
            "scale_by_lbfgs",
            "scale_by_dog",
            "scale_by_dowg",
            "prodigy",
            "dadapt_adamw",
            "mechanize",
            "scale_by_polyak",
        ),
        _GLOBAL_STEP,
    ),
}


def check_optimizer(optimizer: Any) -> None:
    """Refuse an optimizer built with a transformation that needs every stage's
    gradients at once (``optax.clip_by_global_norm``), naming what to use instead."""
    for name in _transformations(optimizer.update):
        if name in _WHOLE_TREE:
            raise ValueError(
                f"the pipeline's optimizer contains optax.{name}, which {_WHOLE_TREE[name]}"
            )


def _transformations(fn: Any) -> set[str]:
    """The names of the optax transformations whose update functions ``fn`` is built
    from: optax.chain, inject_hyperparams, MultiSteps and the other wrappers keep them
    in closures and attributes, which are followed (to a bounded depth)."""
    found: set[str] = set()
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(fn, 0)]
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen or depth > 12:
            continue
        seen.add(id(obj))
        if inspect.ismethod(obj):
            todo.append((obj.__func__, depth + 1))
            todo.append((obj.__self__, depth + 1))
        elif inspect.isfunction(obj):
            if obj.__module__.startswith("optax") and "." in obj.__qualname__:
                found.add(obj.__qualname__.split(".", 1)[0])
            cells = obj.__closure__ or ()
            todo.extend((c.cell_contents, depth + 1) for c in cells if _filled(c))
        elif isinstance(obj, tuple | list):
            todo.extend((v, depth + 1) for v in obj)
        elif isinstance(obj, dict):  # multi_transform's transformations by label
            todo.extend((v, depth + 1) for v in obj.values())
        elif type(obj).__module__.startswith("optax") and hasattr(obj, "__dict__"):
            todo.extend((v, depth + 1) for v in vars(obj).values())
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # a cell not yet filled
        return False
    return True


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
