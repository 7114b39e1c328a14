"""What the proxy reads of a StableHLO module before any host compiles it: its name,
its parameters' and results' shapes and dtypes, and which parameters it donates."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from jax._src.lib.mlir import ir

_ELEMENTS: dict[str, Any] = {
    "i1": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "ui8": np.uint8,
    "ui16": np.uint16,
    "ui32": np.uint32,
    "ui64": np.uint64,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "bf16": ml_dtypes.bfloat16,
    "complex<f32>": np.complex64,
    "complex<f64>": np.complex128,
    "i4": ml_dtypes.int4,
    "ui4": ml_dtypes.uint4,
    "f8E4M3FN": ml_dtypes.float8_e4m3fn,
    "f8E5M2": ml_dtypes.float8_e5m2,
    "f8E4M3B11FNUZ": ml_dtypes.float8_e4m3b11fnuz,
    "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
}

# Parameter attributes by which JAX marks a donated buffer.
_DONOR_ATTRIBUTES = ("tf.aliasing_output", "jax.buffer_donor")


class ModuleError(ValueError):
    """A program the proxy cannot run: it says what it found and what it takes."""


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
    results: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
    donated: tuple[int, ...]
    num_replicas: int
    num_partitions: int


def _aval(t: Any, what: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    try:
        rt = ir.RankedTensorType(t)
    except (TypeError, ValueError):
        raise ModuleError(
            f"{what} is of type {t}; programs run through pathways_nb take and return "
            "arrays only (tokens and host callbacks are not supported)"
        ) from None
    if not rt.has_static_shape:
        raise ModuleError(f"{what} has the dynamic shape {t}; shapes must be static")
    element = str(rt.element_type)
    dtype = _ELEMENTS.get(element)
    if dtype is None:
        raise ModuleError(
            f"{what} has element type {element}, which pathways_nb's hosts do not hold"
        )
    return tuple(int(n) for n in rt.shape), np.dtype(dtype)


def read(artifact: bytes) -> Signature:
    """The signature of the ``main`` function of a StableHLO portable artifact."""
    with mlir.make_ir_context():
        try:
            module = _jax.mlir.deserialize_portable_artifact(artifact)
        except Exception as exc:
            raise ModuleError(f"the program is not a StableHLO portable artifact: {exc}") from None
        if isinstance(module, str | bytes):
            module = ir.Module.parse(module)
        attrs = module.operation.attributes
        name = ir.StringAttr(attrs["sym_name"]).value if "sym_name" in attrs else "program"
        replicas = (
            ir.IntegerAttr(attrs["mhlo.num_replicas"]).value if "mhlo.num_replicas" in attrs else 1
        )
        partitions = (
            ir.IntegerAttr(attrs["mhlo.num_partitions"]).value
            if "mhlo.num_partitions" in attrs
            else 1
        )
        for op in module.body.operations:
            o = op.operation
            if o.name == "func.func" and ir.StringAttr(o.attributes["sym_name"]).value == "main":
                break
        else:
            raise ModuleError(f"program {name} has no main function")
        ftype = ir.FunctionType(ir.TypeAttr(o.attributes["function_type"]).value)
        params = tuple(_aval(t, f"parameter {i} of {name}") for i, t in enumerate(ftype.inputs))
        results = tuple(_aval(t, f"result {i} of {name}") for i, t in enumerate(ftype.results))
        donated = []
        if "arg_attrs" in o.attributes:
            for i, a in enumerate(ir.ArrayAttr(o.attributes["arg_attrs"])):
                d = ir.DictAttr(a)
                if any(k in d for k in _DONOR_ATTRIBUTES):
                    donated.append(i)
    return Signature(name, params, results, tuple(donated), int(replicas), int(partitions))
