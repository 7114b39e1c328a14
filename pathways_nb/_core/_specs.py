"""Mesh shapes and PartitionSpecs in a msgpack-able form."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jax.sharding import PartitionSpec

EncodedSpec = list[Any]
# The part of an array one device holds: (start, stop) per dimension.
Region = tuple[tuple[int, int], ...]


def entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one PartitionSpec entry splits a dimension over: ``None`` none, a
    name one, a tuple of names each (encoded specs carry lists)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def encode_spec(spec: PartitionSpec) -> EncodedSpec:
    """``P("data", None, ("a", "b"))`` → ``["data", None, ["a", "b"]]``."""
    out: EncodedSpec = []
    for entry in spec:
        if entry is None or isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, tuple | list):
            out.append([str(e) for e in entry])
        else:
            raise TypeError(
                f"PartitionSpec entries must be None, an axis name or a tuple of names; "
                f"got {entry!r} in {spec!r}"
            )
    return out


def decode_spec(encoded: Sequence[Any]) -> PartitionSpec:
    """The inverse of :func:`encode_spec`."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in encoded))


def encode_mesh(shape: Mapping[str, int]) -> list[list[Any]]:
    """An ordered mesh shape ``{"data": 4}`` → ``[["data", 4]]``."""
    return [[str(k), int(v)] for k, v in shape.items()]


def decode_mesh(encoded: Sequence[Sequence[Any]]) -> dict[str, int]:
    """The inverse of :func:`encode_mesh`."""
    return {str(k): int(v) for k, v in encoded}


def validate_weight(weight: Any) -> float:
    """Check a tenant's weight (its share of contended islands): a finite number > 0."""
    ok = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
    if not ok or not math.isfinite(weight) or weight <= 0:
        raise ValueError(
            "a tenant's weight is its share of contended islands against other tenants' "
            f"(weight 2 gets twice the device time of weight 1): a finite number > 0; got "
            f"{weight!r}"
        )
    return float(weight)


def validate_mesh_shape(shape: Any) -> dict[str, int]:
    """Check a user's mesh shape and return it as an ordered ``dict``."""
    if not isinstance(shape, Mapping) or not shape:
        raise ValueError(
            f"a virtual slice is a named mesh such as {{'data': 4}} or {{'data': 2, 'model': 2}}; "
            f"got {shape!r}"
        )
    out: dict[str, int] = {}
    for name, size in shape.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh axis names must be identifiers; got {name!r} in {shape!r}")
        if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 1:
            raise ValueError(
                f"mesh axis sizes must be positive integers; got {name}={size!r} in {shape!r}"
            )
        out[name] = int(size)  # NumPy integers too, as jax.make_mesh takes them
    return out


def shard_indices(
    shape: Sequence[int], spec: Sequence[Any], mesh: Sequence[Sequence[Any]]
) -> list[Region]:
    """The region of an array of ``shape`` each device of a mesh holds, in mesh order.

    ``spec`` is an encoded PartitionSpec (``[None, "x", ["a", "b"]]``); ``mesh`` is
    ``[[axis, size], ...]``. Devices are numbered row-major over the mesh axes, as
    ``jax.sharding.Mesh`` lays out a reshaped device list.
    """
    sizes = {str(a): int(n) for a, n in mesh}
    names = [str(a) for a, _ in mesh]
    if len(spec) > len(shape):
        raise ValueError(f"spec {spec} has more entries than the array has dimensions {shape}")
    dims: list[list[str]] = []
    for d, entry in enumerate(spec):
        axes = list(entry_axes(entry))
        for a in axes:
            if a not in sizes:
                raise ValueError(f"spec {spec} names axis {a!r}; the mesh has {names}")
        parts = math.prod(sizes[a] for a in axes)
        if shape[d] % parts:
            raise ValueError(
                f"dimension {d} of shape {tuple(shape)} does not split evenly into {parts} "
                f"shards for spec {spec}"
            )
        dims.append(axes)
    dims += [[] for _ in range(len(shape) - len(spec))]
    out = []
    for flat in range(math.prod(sizes[a] for a in names)):
        coord: dict[str, int] = {}
        rest = flat
        for a in reversed(names):
            coord[a] = rest % sizes[a]
            rest //= sizes[a]
        index = []
        for d, axes in enumerate(dims):
            chunk = shape[d]
            pos = 0
            for a in axes:  # the first axis of a tuple is the major one
                chunk //= sizes[a]
                pos = pos * sizes[a] + coord[a]
            index.append((pos * chunk, (pos + 1) * chunk))
        out.append(tuple(index))
    return out
