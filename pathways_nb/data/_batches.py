"""A dataset of Dask arrays, a batch at a time, each batch computed beside its host."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from jax.sharding import PartitionSpec

    from pathways_nb.client import RemoteArray, VirtualSlice


def batches(
    data: Any,
    vs: VirtualSlice,
    *,
    batch_size: int,
    spec: PartitionSpec | Any = None,
    prefetch: int = 2,
    drop_remainder: bool = True,
    shuffle: int | None = None,
) -> Iterator[Any]:
    """Yield ``data`` (a Dask array, or a pytree of them sharing their first dimension)
    as consecutive batches of ``batch_size`` rows on slice ``vs``: the same pytree of
    RemoteArrays for each.

    Each batch is a put of a Dask array (``vs.put``): the Dask worker that runs the
    slice's host computes it and stores it there, so its bytes never cross this client.
    ``prefetch`` batches compute ahead of the one the loop holds; a batch is yielded
    once it is on the host, so a training loop never waits on a batch its host is still
    reading, and no more than ``prefetch + 1`` batches are in the pipeline at a time. A
    batch whose computation failed raises its error (with the Dask traceback) where it
    would have been yielded. Batches lost with their host before the loop took them are
    computed again once the slice is remapped (see ``VirtualSlice.wait_active``), so a
    loop that puts its checkpoint back after a ``pw.DataLossError`` goes on with the
    next batch.

    ``spec`` is a PartitionSpec for every leaf, or a pytree of them matching ``data``;
    by default the rows split over the slice's first mesh axis (``P("data")`` on a
    ``{"data": 4}`` slice). ``drop_remainder`` leaves out a last batch shorter than
    ``batch_size``, so every batch has one shape and programs compile once.

    ``shuffle=seed`` takes the rows in the order of
    ``np.random.default_rng(seed).permutation(rows)`` (the same in every leaf): pass a
    new seed each epoch (``shuffle=epoch``) for a new order. Each batch then gathers
    its rows from wherever Dask holds them. None keeps the rows in order.

    >>> for epoch in range(3):
    ...     for bx, by in pw.data.batches((x, y), vs, batch_size=256, shuffle=epoch):
    ...         params, opt_state, loss = step(params, opt_state, bx, by)
    """
    import jax
    from jax.sharding import PartitionSpec

    from pathways_nb.client import VirtualSlice

    if not isinstance(vs, VirtualSlice):
        raise TypeError(f"batches puts on a VirtualSlice (client.allocate(...)); got {vs!r}")
    size = _positive("batch_size", batch_size)
    ahead = _positive("prefetch", prefetch, zero=True)
    if not isinstance(drop_remainder, bool):
        raise TypeError(f"drop_remainder is True or False; got {drop_remainder!r}")
    if shuffle is not None and (isinstance(shuffle, bool) or not isinstance(shuffle, int)):
        raise TypeError(f"shuffle is a seed (an int) or None; got {shuffle!r}")
    leaves, treedef = jax.tree.flatten(data)
    rows = _rows(leaves)
    if spec is None:
        spec = PartitionSpec(next(iter(vs.mesh_shape)))
    count = rows // size if drop_remainder else -(-rows // size)
    if count == 0:
        raise ValueError(
            f"the data has {rows} rows, fewer than one batch of {size}"
            + (" (drop_remainder=True leaves out a shorter batch)" if drop_remainder else "")
        )
    # Every batch's put is checked before any is sent: a spec that cannot split a
    # batch over the slice is an error here, not at the first or the last batch.
    specs = _leaf_specs(spec, treedef, len(leaves))
    last = rows - (count - 1) * size
    for n in {size, min(size, last)}:
        for s, leaf in zip(specs, leaves, strict=True):
            _check_spec(vs, s, (n, *leaf.shape[1:]), shorter=n != size)
    order = None if shuffle is None else np.random.default_rng(shuffle).permutation(rows)
    return _walk(leaves, treedef, vs, specs, size, rows, count, ahead, order)


def _walk(
    leaves: list[Any],
    treedef: Any,
    vs: VirtualSlice,
    specs: list[PartitionSpec],
    size: int,
    rows: int,
    count: int,
    ahead: int,
    order: np.ndarray | None,
) -> Iterator[Any]:
    import jax

    import pathways_nb as pw

    # (index, batch, the slice's epoch once its put was sent) of each batch in flight.
    queue: collections.deque[tuple[int, Any, int]] = collections.deque()

    def put(i: int) -> tuple[int, Any, int]:
        lo, hi = i * size, min(rows, (i + 1) * size)
        rows_of = slice(lo, hi) if order is None else order[lo:hi]
        # One put per leaf: a tuple given to put is one array-like, as np.asarray reads it.
        parts = [vs.put(x[rows_of], s) for x, s in zip(leaves, specs, strict=True)]
        return i, jax.tree.unflatten(treedef, parts), vs.epoch

    def wait(batch: Any) -> None:
        arrays: list[RemoteArray] = jax.tree.leaves(batch)
        for a in arrays:
            a.block_until_ready()

    submitted = 0
    for _ in range(count):
        while submitted < count and len(queue) <= ahead:
            queue.append(put(submitted))
            submitted += 1
        i, batch, _ = queue.popleft()
        try:
            wait(batch)
        except pw.DataLossError:
            # Its host died before the loop took it. Its rows are still in Dask: they are
            # computed again where the slice is now (a put to a lost slice waits for its
            # remap), as are those of the batches behind it put before that remap. A loss
            # of the batch put again, or no remap in time, is raised.
            _, batch, epoch = put(i)
            for k, (j, _, was) in enumerate(list(queue)):
                if was < epoch:
                    queue[k] = put(j)
            wait(batch)
        yield batch


def _positive(name: str, value: Any, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ValueError(
            f"{name} is a whole number of {'0' if zero else '1'} or more; got {value!r}"
        )
    return value


def _rows(leaves: list[Any]) -> int:
    import dask.array as da

    if not leaves:
        raise ValueError("batches needs at least one Dask array; got an empty pytree")
    for x in leaves:
        if not isinstance(x, da.Array):
            raise TypeError(
                f"batches takes Dask arrays (or a pytree of them); got {type(x).__name__}. "
                "Wrap a NumPy array with dask.array.from_array(a, chunks=...), a Dask "
                "DataFrame with df.to_dask_array(lengths=True)"
            )
        if x.ndim == 0:
            raise ValueError("batches splits arrays along their first dimension; got a scalar")
    shapes = [x.shape for x in leaves]
    firsts = {s[0] for s in shapes}
    if any(n != n for n in firsts):  # NaN: Dask does not know the lengths yet
        raise ValueError(
            f"the number of rows of these Dask arrays is not known yet ({shapes}): call "
            "x.compute_chunk_sizes() first (or give lengths= where they were made)"
        )
    if len(firsts) != 1:
        raise ValueError(f"batches takes arrays with the same number of rows; got shapes {shapes}")
    return int(firsts.pop())


def _leaf_specs(spec: Any, treedef: Any, n: int) -> list[PartitionSpec]:
    from jax.sharding import PartitionSpec

    if isinstance(spec, PartitionSpec):
        return [spec] * n
    try:
        specs = list(treedef.flatten_up_to(spec))
    except (ValueError, TypeError):
        specs = []
    if len(specs) != n or not all(isinstance(s, PartitionSpec) for s in specs):
        raise ValueError(
            "batches' spec is one PartitionSpec for every array or a pytree of them "
            f"matching the data's structure ({treedef}); got {spec!r}"
        )
    return specs


def _check_spec(
    vs: VirtualSlice, spec: PartitionSpec, shape: tuple[int, ...], *, shorter: bool
) -> None:
    """Raise ValueError unless a batch of ``shape`` (the last, shorter one if
    ``shorter``) can be laid out by ``spec`` on ``vs``, with advice fitting the cause."""
    try:
        vs.check_spec(spec, shape)
    except ValueError as exc:
        raise ValueError(
            f"a batch of shape {shape} cannot be laid out by {spec} on slice {vs.name!r}: "
            f"{exc}{_batch_advice(vs, spec, shape, shorter)}"
        ) from None


def _batch_advice(
    vs: VirtualSlice, spec: PartitionSpec, shape: tuple[int, ...], shorter: bool
) -> str:
    """Advice beyond the slice's own when the rows of a batch are what does not split:
    there the batch size is the thing to change. Other causes (an axis the slice lacks,
    another dimension) carry their own advice already."""
    from jax.sharding import PartitionSpec

    if not len(spec) or len(spec) > len(shape):
        return ""  # no rows split, or a rank its own message explains
    try:
        vs.check_axes(spec)
    except ValueError:
        return ""  # an axis the slice lacks
    try:
        vs.check_spec(PartitionSpec(spec[0]), shape[:1])
    except ValueError:
        pass  # the rows are what does not split
    else:
        return ""  # another dimension
    if shorter:
        return (
            ". It is the last batch, of the rows left over: leave it out "
            "(drop_remainder=True) or choose a batch_size that leaves a number of rows over "
            "that those devices divide"
        )
    return ". Choose a batch_size that those devices divide"
