"""IFRT's words for dtypes, shapes and shardings, and ours.

A sharding crosses the IFRT proxy as a ``Serialized`` message named by its C++ type.
The proxy holds every array's layout as a :class:`Layout`: the IFRT device ids it lives
on and XLA's ``OpSharding`` over them (serialized; empty for replicated), which is what
JAX's ``NamedSharding`` becomes in IFRT and what a host builds a ``GSPMDSharding`` from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

from pathways_nb.proxy._protos import message

HLO_SHARDING = "xla::ifrt::HloSharding"
SINGLE_DEVICE_SHARDING = "xla::ifrt::SingleDeviceSharding"
CONCRETE_EVEN_SHARDING = "xla::ifrt::ConcreteEvenSharding"

_KINDS: dict[str, Any] = {
    "KIND_PRED": np.bool_,
    "KIND_S4": ml_dtypes.int4,
    "KIND_S8": np.int8,
    "KIND_S16": np.int16,
    "KIND_S32": np.int32,
    "KIND_S64": np.int64,
    "KIND_U4": ml_dtypes.uint4,
    "KIND_U8": np.uint8,
    "KIND_U16": np.uint16,
    "KIND_U32": np.uint32,
    "KIND_U64": np.uint64,
    "KIND_F16": np.float16,
    "KIND_F32": np.float32,
    "KIND_F64": np.float64,
    "KIND_BF16": ml_dtypes.bfloat16,
    "KIND_C64": np.complex64,
    "KIND_C128": np.complex128,
    "KIND_F8E4M3FN": ml_dtypes.float8_e4m3fn,
    "KIND_F8E5M2": ml_dtypes.float8_e5m2,
    "KIND_F8E4M3B11FNUZ": ml_dtypes.float8_e4m3b11fnuz,
    "KIND_F8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "KIND_F8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
}


class LayoutError(ValueError):
    """A dtype or sharding the proxy does not hold; the message says which."""


def _kind_enum() -> Any:
    return message("xla.ifrt.DTypeProto").Kind


def dtype_of(proto: Any) -> np.dtype[Any]:
    """The NumPy dtype of a ``DTypeProto``."""
    name = _kind_enum().Name(proto.kind) if proto.kind in _kind_enum().values() else proto.kind
    dt = _KINDS.get(name)
    if dt is None:
        raise LayoutError(
            f"dtype {name} is not one pathways_nb's hosts hold; they hold booleans, integers, "
            "floats (bfloat16 and float8 included) and complex numbers"
        )
    return np.dtype(dt)


def dtype_proto(dtype: np.dtype[Any]) -> Any:
    out = message("xla.ifrt.DTypeProto")()
    for name, dt in _KINDS.items():
        if np.dtype(dt) == dtype:
            out.kind = _kind_enum().Value(name)
            return out
    raise LayoutError(f"dtype {dtype} has no IFRT kind")


def shape_of(proto: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in proto.dims)


def shape_proto(shape: tuple[int, ...]) -> Any:
    out = message("xla.ifrt.ShapeProto")()
    out.dims.extend(shape)
    return out


@dataclasses.dataclass(frozen=True)
class Layout:
    """An array's devices (IFRT ids, in the sharding's order) and its ``OpSharding``
    (serialized; ``b""`` for replicated), in a memory kind."""

    devices: tuple[int, ...]
    op: bytes = b""
    memory_kind: str = "device"

    @property
    def replicated(self) -> bool:
        if not self.op:
            return True
        op = message("xla.OpSharding").FromString(self.op)
        return bool(op.type == message("xla.OpSharding").REPLICATED)


def summed(op: bytes) -> bytes:
    """``op`` (serialized ``OpSharding``) with its unreduced devices taken as replicas:
    they hold partial sums of the same region, so where each device's part of the array
    lies is where the replicated layout puts it."""
    if not op:
        return op
    cls = message("xla.OpSharding")
    o = cls.FromString(op)
    if o.type == cls.UNREDUCED:
        return b""
    kinds = list(o.last_tile_dims)
    if cls.UNREDUCED not in kinds:
        return op
    if set(kinds) <= {cls.REPLICATED, cls.UNREDUCED}:
        # One replicated last dimension of them all: adjacent dims merged in order.
        dims = list(o.tile_assignment_dimensions)
        rank = len(dims) - len(kinds)
        size = 1
        for n in dims[rank:]:
            size *= n
        del o.tile_assignment_dimensions[rank:]
        o.tile_assignment_dimensions.append(size)
        del o.last_tile_dims[:]
        o.last_tile_dims.append(cls.REPLICATED)
    else:
        o.last_tile_dims[:] = [cls.REPLICATED if k == cls.UNREDUCED else k for k in kinds]
    return bytes(o.SerializeToString())


def layout_of(proto: Any) -> Layout:
    """The :class:`Layout` of a ``ShardingProto``."""
    ser = proto.serialized_sharding
    if ser.type_name == HLO_SHARDING:
        h = message("xla.ifrt.HloShardingProto").FromString(ser.data)
        kind = h.memory_kind if h.HasField("memory_kind") else "device"
        return Layout(tuple(h.devices.device_ids), h.xla_op_sharding.SerializeToString(), kind)
    if ser.type_name == SINGLE_DEVICE_SHARDING:
        s = message("xla.ifrt.SingleDeviceShardingProto").FromString(ser.data)
        kind = s.memory_kind if s.HasField("memory_kind") else "device"
        return Layout((int(s.device_id),), b"", kind)
    if ser.type_name == CONCRETE_EVEN_SHARDING:
        c = message("xla.ifrt.ConcreteEvenShardingProto").FromString(ser.data)
        if c.is_fully_replicated or len(c.devices.device_ids) == 1:
            kind = c.memory_kind if c.HasField("memory_kind") else "device"
            return Layout(tuple(c.devices.device_ids), b"", kind)
    raise LayoutError(
        f"sharding {ser.type_name or '(none)'} is not one the pathways_nb proxy lays arrays "
        f"out by; it takes {HLO_SHARDING} (what NamedSharding and PositionalSharding become), "
        f"{SINGLE_DEVICE_SHARDING} and a fully replicated {CONCRETE_EVEN_SHARDING}"
    )


def sharding_proto(layout: Layout) -> Any:
    """A ``ShardingProto`` naming ``layout`` as an ``HloSharding``."""
    h = message("xla.ifrt.HloShardingProto")()
    h.devices.device_ids.extend(layout.devices)
    h.memory_kind = layout.memory_kind
    if layout.op:
        h.xla_op_sharding.ParseFromString(layout.op)
    out = message("xla.ifrt.ShardingProto")()
    out.serialized_sharding.type_name = HLO_SHARDING
    out.serialized_sharding.data = h.SerializeToString()
    return out
