"""``remap_arrays``: shards of arrays moved into shard slots of new arrays, as a plan maps
them (JAX's reshard between device orders, ``pathwaysutils``' reshard).

An output fed whole by one input is that input's shards in a new device order: a move
host to host, laid out by the input's tiling with the devices permuted as the plan
says. Outputs put together from several inputs are assembled here from their values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pathways_nb.proxy import _status
from pathways_nb.proxy._layouts import Layout, LayoutError, dtype_of, layout_of, shape_of
from pathways_nb.proxy._protos import message
from pathways_nb.proxy._session import Entry, Session, donates, register
from pathways_nb.proxy._status import ProxyError


def intervals(starts: Any, ends: Any, steps: Any) -> list[int]:
    """The shard indices of a mapping's ``[start, end)`` intervals, by step."""
    return [k for a, b, c in zip(starts, ends, steps, strict=True) for k in range(a, b, c or 1)]


def permuted(op: bytes, slots: list[int]) -> bytes:
    """``op`` (a serialized ``OpSharding`` over n devices) with its shard on device
    position ``k`` moved to position ``slots[k]``."""
    if not op:
        return op
    from jax._src.lib import xla_client as xc

    from pathways_nb._core import op_sharding

    devices = xc.HloSharding.from_proto(op_sharding(op)).tile_assignment_devices()
    o = message("xla.OpSharding").FromString(op)
    del o.iota_reshape_dims[:]
    del o.iota_transpose_perm[:]
    del o.tile_assignment_devices[:]
    o.tile_assignment_devices.extend(slots[int(d)] for d in devices)
    return bytes(o.SerializeToString())


def _remap(s: Session, req: Any, body: Any) -> None:
    plan = req.plan
    handles, results = list(req.array_handles), list(req.result_handles)
    if len(plan.input_specs) != len(handles) or len(plan.output_specs) != len(results):
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"a remap plan of {len(plan.input_specs)} inputs and {len(plan.output_specs)} "
            f"outputs given {len(handles)} arrays and {len(results)} result handles",
        )
    inputs = [s.entry(h) for h in handles]
    # Per output: (input, shard k, slot j) of every mapping into it.
    feeds: list[list[tuple[int, int, int]]] = [[] for _ in results]
    for m in plan.mappings:
        froms = intervals(m.from_start, m.from_end, m.from_step)
        tos = intervals(m.to_start, m.to_end, m.to_step)
        if len(froms) != len(tos):
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"a remap mapping moves {len(froms)} shards into {len(tos)} slots",
            )
        if not 0 <= m.in_array < len(inputs) or not 0 <= m.out_array < len(results):
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"a remap mapping names input {m.in_array} and output {m.out_array} of a "
                f"plan of {len(inputs)} inputs and {len(results)} outputs",
            )
        feeds[m.out_array].extend((m.in_array, k, j) for k, j in zip(froms, tos, strict=True))
    made = [
        _output(s, spec, [(inputs[i], k, j) for i, k, j in feed])
        for spec, feed in zip(plan.output_specs, feeds, strict=True)
    ]
    for r, e in zip(results, made, strict=True):
        s.store(r, e)
    if donates(req.copy_semantics):
        for e in inputs:
            s.drop(e)
    body.array_handles.extend(results)


def _output(s: Session, spec: Any, feed: list[tuple[Entry, int, int]]) -> Entry:
    """One output of a plan, from the (input, shard, slot) triples that fill it."""
    shape, dtype = shape_of(spec.shape), dtype_of(spec.dtype)
    sources = {id(e) for e, _, _ in feed}
    src = feed[0][0] if len(sources) == 1 and feed[0][0].shape == shape else None
    try:
        layout: Layout | None = layout_of(spec.sharding)
    except LayoutError:
        # A sharded ConcreteEvenSharding, as JAX names a reorder's outputs: its layout
        # is the input's, its shards in the slots the plan puts them in.
        if src is None:
            raise
        layout = None
    if layout is None:
        c = message("xla.ifrt.ConcreteEvenShardingProto").FromString(
            spec.sharding.serialized_sharding.data
        )
        devices = tuple(int(d) for d in c.devices.device_ids)
        kind = c.memory_kind if c.HasField("memory_kind") else "device"
    else:
        devices, kind = layout.devices, layout.memory_kind
    reorder = _reorder(src, feed, len(devices)) if src is not None else None
    if layout is None:
        if src is None or reorder is None:
            raise ProxyError(
                _status.UNIMPLEMENTED,
                f"a remap into a sharded ConcreteEvenSharding over {len(devices)} devices "
                "that is not a reordering of one input's shards; the pathways_nb proxy "
                "remaps those, and outputs named by an HloSharding",
            )
        layout = Layout(devices, reorder, kind)
    if src is not None and reorder is not None and layout.op == reorder:
        return s.backend.relayout(src, layout)
    value = np.zeros(shape, dtype)
    rout = s.backend.regions(layout, shape)
    read: dict[int, tuple[np.ndarray, list[tuple[slice, ...]]]] = {}
    for e, k, j in feed:
        if id(e) not in read:
            read[id(e)] = (s.backend.fetch(e), s.backend.regions(e.layout, e.shape))
        got, rin = read[id(e)]
        value[rout[j]] = got[rin[k]]
    return s.backend.put(value, layout)


def _reorder(src: Entry, feed: list[tuple[Entry, int, int]], slots_out: int) -> bytes | None:
    """The layout of ``src``'s shards put one to a slot, all of them, into an output of
    ``slots_out`` devices (its tiling with the devices permuted); None for a plan that
    does otherwise."""
    slots = {k: j for _, k, j in feed}
    n = len(src.layout.devices)
    if len(feed) != n or sorted(slots) != list(range(n)):
        return None
    if n != slots_out or sorted(slots.values()) != list(range(n)):
        return None
    return permuted(src.layout.op, [slots[k] for k in range(n)])


register("remap_arrays_request", _remap)
