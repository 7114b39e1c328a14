"""Pipeline parallelism: a model split into stages on different slices, trained with
microbatches under a GPipe or 1F1B schedule.

Every stage's programs are ``pw.jit`` functions pinned to its slice: forward, backward,
gradient accumulation and the optimizer update. A ``jax.vjp`` closure cannot be
exported, but it is a pytree: the forward returns its leaves (the residuals), which
stay on the slice as remote arrays, and the backward program rebuilds it from them (or,
with ``remat=True``, the backward recomputes the forward from the stage's input). A
residual that is one of the stage's inputs or its output (the weights, the activation)
is not returned again: the backward takes the remote array it already is. Activations
and their gradients move between slices host to host. The schedule is the order in which the
client submits these programs; it never waits, so each island's gang scheduler sees
its stage's programs in schedule order and the stages overlap on their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pathways_nb.client._interrupts import interrupts_held
from pathways_nb.client._jit import RemoteFunction, jit
from pathways_nb.client._pipeline_checks import (
    check_arguments,
    check_clip,
    check_flag,
    check_optimizer,
    check_own_arrays,
    check_per_stage,
    check_trainable,
    row_axes,
)
from pathways_nb.client._programs import _moved_spec
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._schedules import (
    busy_time,
    scheduled_bubble,
    stage_orders,
    submission_order,
    theoretical_bubble,
)
from pathways_nb.client._stages import (
    backward,
    backward_from_residuals,
    cut_microbatches,
    done_token,
    gradient_share,
    last,
    loss_after,
    loss_ratio,
    per_device,
    reduce_then,
    update,
    with_residuals,
)
from pathways_nb.client._ties import (
    check_ties,
    device_total,
    followers,
    leaf_at,
    parse_ties,
    started_alike,
    tied_sum,
    tied_sum_per_device,
    with_leaf,
)

if TYPE_CHECKING:
    import pandas as pd

    from pathways_nb.client._slice import VirtualSlice


class Pipeline:
    """A training step for a model split into stages; made by :func:`pipeline`.

    >>> step = pw.pipeline([s0, s1, s2, s3], slices, loss_fn, optax.adam(1e-3),
    ...                    microbatches=8, schedule="1f1b")
    >>> params, opt_state = step.init([p0, p1, p2, p3])
    >>> params, opt_state, loss = step(params, opt_state, x, y)
    """

    def __init__(
        self,
        stages: Sequence[Callable[[Any, Any], Any]],
        slices: Sequence[VirtualSlice],
        loss_fn: Callable[[Any, Any], Any],
        optimizer: Any,
        microbatches: int,
        schedule: str,
        batch_spec: PartitionSpec,
        remat: bool = False,
        reduce_grads: str = "microbatch",
        extra_warmup: int = 0,
        clip_grad_norm: float | None = None,
        skip_nonfinite: bool = False,
        weighted_loss: bool = False,
        tied: Any = None,
    ) -> None:
        check_arguments(stages, slices, loss_fn, optimizer, microbatches, batch_spec, remat)
        clip_grad_norm = check_clip(clip_grad_norm)
        check_flag("skip_nonfinite", skip_nonfinite)
        check_flag("weighted_loss", weighted_loss)
        check_optimizer(optimizer)
        self.stages = list(stages)
        self.slices = list(slices)
        self.microbatches = microbatches
        self.schedule = schedule
        self.batch_spec = batch_spec
        self.remat = remat
        self.reduce_grads = reduce_grads
        self.optimizer = optimizer
        self.extra_warmup = extra_warmup
        self.clip_grad_norm = clip_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.weighted_loss = weighted_loss
        self.tied = parse_ties(tied, len(stages))
        self._orders = stage_orders(len(stages), microbatches, schedule, extra_warmup)
        self.order = submission_order(self._orders)
        n = len(stages)
        m = float(microbatches)
        self._fwd: list[RemoteFunction] = []
        self._bwd_first: list[RemoteFunction] = []
        self._bwd: list[RemoteFunction] = []
        self._update: list[RemoteFunction] = []
        self._shares: list[RemoteFunction] = []
        self._tied_sums: list[RemoteFunction] = []
        self._tied_totals: list[RemoteFunction] = []
        axes = row_axes(batch_spec, reduce_grads)
        for s, (fn, vs) in enumerate(zip(stages, slices, strict=True)):
            name = f"stage{s}:{getattr(fn, '__name__', 'stage')}"
            if remat:
                forward: Any = fn
                first, acc = backward(fn, s == 0)
                donate = 3
            else:
                # The forward returns its residuals as well; they stay on this slice as
                # remote arrays until the backward.
                forward = with_residuals(fn)
                first, acc = backward_from_residuals(fn, s == 0)
                donate = 5
            apply = update(optimizer, clip_grad_norm, skip_nonfinite)
            uncounted = followers(self.tied, s)
            share = gradient_share(uncounted=uncounted)
            add_tied = tied_sum
            if axes is not None:
                mesh = vs.abstract_mesh
                forward, first, acc = per_device(forward, first, acc, remat, s == 0, mesh, axes)
                apply = reduce_then(apply, mesh)
                share = gradient_share(mesh, uncounted)
                add_tied = tied_sum_per_device
            self._shares.append(jit(share, slice=vs, name=f"{name}.grad_share"))
            self._tied_sums.append(jit(add_tied, slice=vs, name=f"{name}.tied_grad"))
            self._tied_totals.append(jit(device_total, slice=vs, name=f"{name}.tied_total"))
            self._fwd.append(jit(forward, slice=vs, name=f"{name}.fwd"))
            self._bwd_first.append(jit(first, slice=vs, name=f"{name}.bwd"))
            self._bwd.append(jit(acc, slice=vs, name=f"{name}.bwd", donate_argnums=(donate,)))
            self._update.append(
                jit(apply, slice=vs, name=f"{name}.update", donate_argnums=(0, 1, 2))
            )
        rows = None if axes is None else (slices[-1].abstract_mesh, axes)
        last_first, last_acc = last(stages[-1], loss_fn, m, n == 1, rows, weighted_loss)
        lname = f"stage{n - 1}:{getattr(stages[-1], '__name__', 'stage')}"
        self._last_first = jit(last_first, slice=slices[-1], name=f"{lname}.loss")
        self._last = jit(last_acc, slice=slices[-1], name=f"{lname}.loss", donate_argnums=(3, 4))
        self._ratio = jit(loss_ratio, slice=slices[-1], name=f"{lname}.loss_ratio")
        self._done = [
            jit(done_token, slice=vs, name=f"stage{s}.done", keep_unused=True)
            for s, vs in enumerate(slices)
        ]
        self._loss_after = jit(
            loss_after, slice=slices[-1], name=f"{lname}.loss_done", keep_unused=True
        )
        self._splits: dict[int, RemoteFunction] = {}
        # The last step's new parameters, optimizer state and loss, as it returned them.
        self.last: tuple[list[Any], list[Any], RemoteArray] | None = None
        self._opt_init = [
            jit(optimizer.init, slice=vs, name=f"stage{s}.opt_init") for s, vs in enumerate(slices)
        ]

    def __repr__(self) -> str:
        names = [getattr(fn, "__name__", type(fn).__name__) for fn in self.stages]
        extra = "".join(
            f", {k}={v!r}"
            for k, v, default in (
                ("remat", self.remat, False),
                ("reduce_grads", self.reduce_grads, "microbatch"),
                ("extra_warmup", self.extra_warmup, 0),
                ("clip_grad_norm", self.clip_grad_norm, None),
                ("skip_nonfinite", self.skip_nonfinite, False),
                ("weighted_loss", self.weighted_loss, False),
                ("tied", [str(t) for t in self.tied], []),
            )
            if v != default
        )
        bubble = theoretical_bubble(len(self.stages), self.microbatches)
        return (
            f"Pipeline(stages={names}, slices={[vs.name for vs in self.slices]}, "
            f"microbatches={self.microbatches}, schedule={self.schedule!r}{extra}, "
            f"bubble_theoretical={bubble:.3f})"
        )

    def init(self, params: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Place each stage's parameters on its slice and make the optimizer state there.

        Values become replicated arrays on the stage's slice; a RemoteArray already there
        is kept as it is, one on another slice is moved there (keeping its PartitionSpec
        where the stage's mesh has those axes, replicated otherwise).
        """
        check_per_stage(
            "params", params, len(self.slices), "a list with one parameter tree per stage"
        )
        check_own_arrays(params)
        check_trainable(params)
        check_ties(self.tied, params)
        params = started_alike(self.tied, params)

        def place(v: Any, vs: VirtualSlice) -> Any:
            if not isinstance(v, RemoteArray):
                return vs.put(v, PartitionSpec())
            if v.slice is vs:
                return v
            return vs.put(v, _moved_spec(v, vs, None))

        placed = [
            jax.tree.map(lambda v, vs=vs: place(v, vs), p)
            for p, vs in zip(params, self.slices, strict=True)
        ]
        states = [f(p) for f, p in zip(self._opt_init, placed, strict=True)]
        return placed, states

    def _split(self, batch: Any, vs: VirtualSlice) -> list[Any]:
        """``batch`` (an array or a pytree of them, each leaf one row per example) as
        ``microbatches`` pytrees of the same structure on ``vs``, leaf by leaf (see
        :func:`cut_microbatches`)."""
        m, blocks = self.microbatches, self._row_blocks()
        leaves, treedef = jax.tree.flatten(batch)
        parts = []
        for leaf in leaves:
            if isinstance(leaf, RemoteArray):
                parts.append(list(self._splitter(vs)(leaf)))
            else:
                cut = cut_microbatches(np.asarray(leaf), m, blocks)
                parts.append([vs.put(part, self.batch_spec) for part in cut])
        return [jax.tree.unflatten(treedef, [p[i] for p in parts]) for i in range(m)]

    def _row_blocks(self) -> int:
        """The blocks of rows :func:`cut_microbatches` cuts a step's batch in: the
        devices ``batch_spec`` splits dimension 0 over on the first slice (x) and on the
        last (y), their least common multiple, so x and y are cut alike and neither
        moves between devices."""
        return math.lcm(self._row_devices(self.slices[0]), self._row_devices(self.slices[-1]))

    def _row_devices(self, vs: VirtualSlice) -> int:
        """The devices of ``vs`` that ``batch_spec`` splits a batch's rows over."""
        axes = self.batch_spec[0] if len(self.batch_spec) else None
        names = () if axes is None else axes if isinstance(axes, tuple) else (axes,)
        return math.prod(vs.mesh_shape[a] for a in names if a in vs.mesh_shape)

    def _rows(self, batch: Any, what: str) -> int:
        """The examples in ``batch``: the first dimension every leaf shares, a multiple
        of ``microbatches``; a clear error otherwise."""
        m = self.microbatches
        leaves = jax.tree_util.tree_leaves_with_path(batch)
        if not leaves:
            raise ValueError(
                f"{what} holds no arrays (got {type(batch).__name__}): pass an array, or a "
                "pytree of arrays with one row per example"
            )
        rows = {
            what + jax.tree_util.keystr(k): (np.shape(v)[0] if np.ndim(v) else 0) for k, v in leaves
        }
        counts = set(rows.values())
        if len(counts) > 1:
            raise ValueError(
                f"{what}'s leaves have different numbers of rows {rows}: every leaf of a "
                "batch holds one row per example"
            )
        [n] = counts
        if not n or n % m:
            hint = ""
            if not n and isinstance(batch, (list, tuple)):
                hint = " (a list or tuple is a pytree, as in JAX: np.asarray makes it one array)"
            raise ValueError(
                f"{what} has {n} rows{' in each leaf' if len(rows) > 1 else ''}, which do not "
                f"split into microbatches={m}: pass a batch whose first dimension is a "
                f"multiple of {m}, or choose microbatches that divide it{hint}"
            )
        vs = self.slices[0] if what == "x" else self.slices[-1]
        split = self._row_devices(vs)
        if (n // m) % split:
            raise ValueError(
                f"{what} has {n} rows, so each of its microbatches={m} has {n // m}, which "
                f"batch_spec={self.batch_spec} does not split over {split} devices of "
                f"slice {vs.name!r}: pass a batch of a multiple of {m * split} rows"
            )
        return n

    def _splitter(self, vs: VirtualSlice) -> RemoteFunction:
        # One program per slice, kept: a new function each step would be traced and
        # exported again every step.
        key = id(vs)
        if key not in self._splits:
            m, blocks = self.microbatches, self._row_blocks()

            def split(b: Any) -> tuple[Any, ...]:
                return cut_microbatches(b, m, blocks)

            self._splits[key] = jit(split, slice=vs, name="split", out_shardings=self.batch_spec)
        return self._splits[key]

    def __call__(
        self, params: Sequence[Any], opt_state: Sequence[Any], x: Any, y: Any
    ) -> tuple[list[Any], list[Any], RemoteArray]:
        """One training step; returns new parameters, optimizer state and the mean loss.

        The old parameters and optimizer state are donated.
        """
        n = len(self.stages)
        hint = "what step.init(params) returned, or the previous step's new values"
        check_per_stage("params", params, n, hint)
        check_per_stage("opt_state", opt_state, n, hint)
        check_own_arrays(params)
        check_trainable(params)
        check_ties(self.tied, params)
        nx, ny = self._rows(x, "x"), self._rows(y, "y")
        if nx != ny:
            raise ValueError(
                f"x has {nx} rows and y {ny}: a step takes one row of y per row of x "
                "(each microbatch's loss compares them row by row)"
            )
        try:
            # Submitted whole: its updates donate the old parameters, so a Ctrl-C between
            # two of its launches would leave neither the old state nor the new one. One
            # that comes meanwhile is raised once all are submitted, the new state kept.
            with interrupts_held():
                self.last = None
                self.last = self._step(params, opt_state, x, y)
            return self.last
        except KeyboardInterrupt as exc:
            if self.last is not None:
                exc.add_note(
                    "the step was submitted whole before the interrupt: its new parameters, "
                    "optimizer state and loss are step.last (the old ones went into it)"
                )
            raise
        except Exception as exc:
            # JAX's words for a sharding constraint or collective over an axis that
            # shard_map made manual never mention why the axis is manual here.
            if self.reduce_grads == "step" and "Manual" in str(exc):
                exc.add_note(
                    "reduce_grads='step' runs each stage on each device's own rows (under "
                    "shard_map over batch_spec's axes), where a stage cannot constrain "
                    "shardings or reduce over those axes; a model with such a stage takes "
                    "reduce_grads='microbatch'"
                )
            raise

    def _step(
        self, params: Sequence[Any], opt_state: Sequence[Any], x: Any, y: Any
    ) -> tuple[list[Any], list[Any], RemoteArray]:
        n = len(self.stages)
        xs = self._split(x, self.slices[0])
        ys = self._split(y, self.slices[-1])
        acts: dict[tuple[int, int], Any] = {(0, i): v for i, v in enumerate(xs)}
        # What each backward needs of its forward: its input (remat), or its input,
        # output and the residuals it made.
        saved: dict[tuple[int, int], Any] = {}
        grads_in: dict[tuple[int, int], Any] = {}
        acc: list[Any] = [None] * n
        loss: Any = None
        for op in self.order:
            s, i = op.stage, op.microbatch
            if op.kind == "F":
                x = acts.pop((s, i))
                if self.remat:
                    acts[(s + 1, i)] = self._fwd[s](params[s], x)
                    saved[(s, i)] = (x,)
                else:
                    out, kept = self._fwd[s](params[s], x)
                    acts[(s + 1, i)] = out
                    saved[(s, i)] = (x, out, kept)
            elif op.kind == "L":
                if acc[s] is None:
                    loss, acc[s], gx = self._last_first(params[s], acts[(s, i)], ys[i])
                else:
                    loss, acc[s], gx = self._last(params[s], acts[(s, i)], ys[i], acc[s], loss)
                if s > 0:
                    grads_in[(s - 1, i)] = gx
                del acts[(s, i)]
            else:
                g = grads_in.pop((s, i))
                head = (params[s], *saved.pop((s, i)))
                if acc[s] is None:
                    out = self._bwd_first[s](*head, g)
                else:
                    out = self._bwd[s](*head, g, acc[s])
                if s > 0:
                    acc[s], grads_in[(s - 1, i)] = out
                else:
                    acc[s] = out
        for tie in self.tied:
            # Every copy's gradient is the sum of all of theirs, each read before any is
            # replaced: the copies take one update and stay equal.
            grads = [leaf_at(acc[s], path) for s, path in tie.members]
            given = grads
            if self.reduce_grads == "step":
                # Per-device sums: every copy's total goes in each copy's first row (zeros
                # in the others), and its update adds the rows up.
                given = [
                    self._tied_totals[s](g) for (s, _), g in zip(tie.members, grads, strict=True)
                ]
            sums = [self._tied_sums[s](grads[k], *given) for k, (s, _) in enumerate(tie.members)]
            for (s, path), total_grad in zip(tie.members, sums, strict=True):
                acc[s] = with_leaf(acc[s], path, total_grad)
        weight: tuple[Any, ...] = ()
        if self.weighted_loss:
            # The microbatches' loss sums and weights, added up: every stage's gradient
            # sum is divided by the total weight in its update.
            total, w = loss
            loss, weight = self._ratio(total, w), (w,)
        # Clipping to the global norm, or skipping a step whose gradients are not all
        # finite, needs every stage's share: each update takes all of them (scalars,
        # moved host to host), so no update starts before the last backward has run.
        whole = self.clip_grad_norm is not None or self.skip_nonfinite
        shares = [self._shares[s](acc[s], *weight) for s in range(n)] if whole else []
        new_params, new_states, done = [], [], []
        for s in range(n):
            p, st = self._update[s](params[s], opt_state[s], acc[s], shares, *weight)
            new_params.append(p)
            new_states.append(st)
            done.append(self._done[s](jax.tree.leaves((p, st))[0]))
        return new_params, new_states, self._loss_after(loss, *done)

    def bubble(self, events: pd.DataFrame) -> dict[str, Any]:
        """The idle fraction of each stage's slice over one step, from the event log.

        ``events`` should hold one step (``client.events(since=t)``). A stage is busy
        while one of its programs runs; the span runs from the first program's start to
        the last one's end, over all stages. Beside the measured ``mean``: ``busy_s``,
        each stage's busy seconds (an unbalanced model shows here), ``theoretical``,
        the formula's (S-1)/(M+S-1) for equal stages, and ``scheduled``, the bubble this
        schedule gives with each stage's median program times and hops that take no
        time (see :func:`scheduled_bubble`).
        """
        runs = events[events.kind.isin(["start", "end"]) & (events.program != "transfer")]
        names = {f.name: (s, "F") for s, f in enumerate(self._fwd)}
        names |= {f.name: (s, "B") for s, f in enumerate(self._bwd)}
        names |= {self._last.name: (len(self.stages) - 1, "L")}
        spans: dict[int, list[tuple[float, float]]] = {}
        times: dict[tuple[int, str], list[float]] = {}
        starts: dict[int, float] = {}
        for lid, kind, prog, t in zip(
            runs.lid, runs.kind, runs.program, runs.time.map(lambda v: v.timestamp()), strict=True
        ):
            where = names.get(prog)
            if where is None:
                continue
            if kind == "start":
                starts[lid] = t
            elif lid in starts:
                t0 = starts.pop(lid)
                spans.setdefault(where[0], []).append((t0, t))
                times.setdefault(where, []).append(t - t0)
        if not spans:
            raise ValueError("no stage programs in these events; pass one step's events")
        t0 = min(a for v in spans.values() for a, _ in v)
        t1 = max(b for v in spans.values() for _, b in v)
        busy = {s: busy_time(v) for s, v in sorted(spans.items())}
        per_stage = {s: 1.0 - b / (t1 - t0) if t1 > t0 else 0.0 for s, b in busy.items()}
        needed = {(op.stage, op.kind) for order in self._orders for op in order}
        scheduled = (
            scheduled_bubble(self._orders, {k: float(np.median(times[k])) for k in needed})
            if needed <= times.keys()
            else None  # a partial step: some program never ran in these events
        )
        return {
            "per_stage": per_stage,
            "mean": sum(per_stage.values()) / len(per_stage),
            "busy_s": busy,
            "theoretical": theoretical_bubble(len(self.stages), self.microbatches),
            "scheduled": scheduled,
            "span_s": t1 - t0,
        }


def pipeline(
    stages: Sequence[Callable[[Any, Any], Any]],
    slices: Sequence[VirtualSlice],
    loss_fn: Callable[[Any, Any], Any],
    optimizer: Any,
    microbatches: int = 4,
    schedule: str = "1f1b",
    batch_spec: PartitionSpec | None = None,
    remat: bool = False,
    reduce_grads: str = "microbatch",
    extra_warmup: int = 0,
    clip_grad_norm: float | None = None,
    skip_nonfinite: bool = False,
    weighted_loss: bool = False,
    tied: Any = None,
) -> Pipeline:
    """A pipelined training step over ``slices``, one stage per slice.

    ``stages[i](params_i, x)`` maps stage ``i``'s input to its output;
    ``loss_fn(output, y)`` gives a scalar mean loss; ``optimizer`` is an optax
    ``GradientTransformation``. A step's ``x`` and ``y`` are arrays or pytrees of them
    (``(labels, mask)``, a dict of features), every leaf with one row per example; each
    leaf is cut into the microbatches along its first dimension. ``schedule`` is
    ``"gpipe"`` (all forwards, then all backwards) or ``"1f1b"`` (one forward, one
    backward once warm, so fewer activations wait). ``batch_spec`` shards each
    microbatch over a stage slice's mesh (default: replicated). Where it splits the
    rows over ``D`` devices, each device cuts its own rows, as data-parallel ranks cut
    their local batch: microbatch ``i`` holds the ``i``-th part of each of ``D`` equal
    blocks of the batch's rows (``D=1``: the ``i``-th run of rows; x and y are cut
    alike), so cutting a batch already on the slice moves no rows between its devices.
    Each stage's backward uses the residuals its forward kept on the slice (a
    ``jax.vjp`` returned as remote arrays); ``remat=True`` recomputes the forward
    instead, keeping only the stage's input: less memory, a third more arithmetic.

    ``reduce_grads`` says when a stage's devices add up their parameter gradients:
    ``"microbatch"`` (default) in every backward, exactly as one program over the whole
    batch would; ``"step"`` once per step, in the update, as data-parallel training does:
    every stage then runs on each device's own rows of the microbatch (``batch_spec``
    must split dimension 0, e.g. ``PartitionSpec("data")``; the loss is still taken over
    the whole microbatch), which gives the same result only for stages that treat rows
    independently (no statistics across the batch), and saves one all-reduce of each
    stage's parameters per microbatch.

    ``extra_warmup`` (1F1B only) lets each stage run that many more forwards before its
    first backward than the schedule's minimum (``S-1-s`` on stage ``s``). A backward
    waits for its gradient from the next stage; with a forward still to run, the stage
    runs that meanwhile instead of idling for the hop. Each one holds one more
    microbatch's activations on the stage. The ideal bubble, with hops that take no
    time, is the same; when a hop costs a noticeable part of a stage's program (small
    programs, busy hosts), 1 recovers much of what the hops add to each step.

    The optimizer runs on each stage's slice, on that stage's parameters and gradients.
    A transformation that looks across the whole gradient tree would see one stage's
    share of it, so ``optax.clip_by_global_norm`` and ``optax.apply_if_finite`` are
    refused, as are optimizers whose step comes from norms or inner products over all
    the parameters (L-BFGS, DoG, Prodigy, D-Adaptation, Mechanic, Polyak's step size).
    ``clip_grad_norm`` clips the gradients of all stages together to that global norm
    before the optimizer, as ``optax.chain(optax.clip_by_global_norm(c), optimizer)``
    does for one model; ``skip_nonfinite=True`` leaves every stage's parameters and
    optimizer state as they were in a step where any stage's gradients are not all
    finite (NaN or inf), as ``optax.apply_if_finite`` skips such a step (without its
    count of consecutive skips). Each stage's share, two scalars, goes to the others
    host to host.

    The step's loss is the mean of the microbatches' losses, which is the batch's mean
    when every microbatch weighs the same. A loss over masked rows or tokens does not:
    with ``weighted_loss=True``, ``loss_fn`` returns a pair (sum of the microbatch's
    losses, their weight), e.g. ``(jnp.sum(loss * mask), jnp.sum(mask))``, and the
    step's loss and gradients are those of the sums over the weights of the whole
    batch, as one program over the batch computes them.

    ``tied`` ties leaves of different stages' parameters into one parameter, as an
    input embedding reused as the output projection: ``tied=[((0, "embed"), (3,
    "embed"))]``, each leaf named by its stage and the keys to it. Each stage keeps a
    copy, ``init`` starts every copy from the group's first one, and every step adds
    the copies' gradients up (moved host to host) before the updates, so they take one
    update and stay equal, as one parameter used twice in one program does.
    """
    return Pipeline(
        stages,
        slices,
        loss_fn,
        optimizer,
        microbatches,
        schedule,
        batch_spec if batch_spec is not None else PartitionSpec(),
        remat,
        reduce_grads,
        extra_warmup,
        clip_grad_norm,
        skip_nonfinite,
        weighted_loss,
        tied,
    )
