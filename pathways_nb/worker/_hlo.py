"""Programs that arrive as StableHLO with XLA's compile options (``kind="hlo"``).

Plain JAX run through the IFRT proxy (``pathways_nb.proxy``) compiles its programs
itself: what reaches the proxy is the StableHLO module ``jax.jit`` lowered (a portable
artifact) and the ``xla.CompileOptionsProto`` it would compile with, over devices named
by position among the slice's. The host compiles them as JAX's own backend would, on the
physical devices those positions name now, and runs them on the store's arrays, which
carry the module's shardings (``GSPMDSharding`` s of XLA's ``OpSharding`` s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import sharding_impls
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from jax._src.lib import xla_client as xc

from pathways_nb._core import HloBlob, RemoteError, decode_dtype, op_sharding


def sharding(devices: Sequence[jax.Device], data: bytes) -> Any:
    """The ``jax.sharding.Sharding`` of an array laid out by ``data`` over ``devices``."""
    return sharding_impls.GSPMDSharding(tuple(devices), op_sharding(data))


def hlo_fields(h: Any, n: int, what: str) -> tuple[list[int], bytes]:
    """The positions and OpSharding bytes of an ``hlo_sharding`` field, ``{"op": bytes,
    "positions": [device positions among n]}``, checked; ``what`` names its message."""
    positions = h.get("positions") if isinstance(h, dict) else None
    op = h.get("op") if isinstance(h, dict) else None
    if (
        not isinstance(positions, list)
        or not positions
        or not all(type(p) is int and 0 <= p < n for p in positions)
        or not isinstance(op, bytes)
    ):
        raise RemoteError(
            f"{what} hlo_sharding names OpSharding bytes and device positions among the "
            f"{n} devices it goes to; got {h!r}",
            kind="invalid",
        )
    return positions, op


def placed_by(mesh: jax.sharding.Mesh, put: dict[str, Any], what: str = "a put's") -> Any:
    """The sharding a message's ``hlo_sharding`` field names, as plain JAX asked through
    the IFRT proxy: ``{"op": OpSharding bytes, "positions": [device positions among the
    mesh's]}``; None for one without it (laid out by its PartitionSpec)."""
    h = put.get("hlo_sharding")
    if not isinstance(h, dict):
        return None
    flat = list(mesh.devices.flat)
    positions, op = hlo_fields(h, len(flat), what)
    return sharding([flat[p] for p in positions], op)


class HloProgram:
    """A StableHLO program, checked when it arrives; compiled per device assignment."""

    def __init__(self, name: str, blob: bytes) -> None:
        try:
            blob_ = HloBlob.unpack(blob)
        except ValueError as exc:
            raise RemoteError(
                f"program {name} is not a StableHLO program this host reads: {exc}",
                kind="invalid",
            ) from None
        self.module = blob_.module
        self.options = blob_.options
        self.positions = list(blob_.positions)
        self.out_shapes = [s for s, _ in blob_.outputs]
        try:
            self.out_dtypes = [decode_dtype(d) for _, d in blob_.outputs]
        except Exception as exc:
            raise RemoteError(
                f"program {name} declares an output dtype this host does not know: {exc}",
                kind="invalid",
            ) from None
        self.name = name
        self.out_nbytes = [
            math.prod(s) * d.itemsize for s, d in zip(self.out_shapes, self.out_dtypes, strict=True)
        ]

    def bind(self, mesh: jax.sharding.Mesh) -> HloExecutable:
        """Compiled on the devices of ``mesh`` (the slice's) at the program's positions."""
        flat = list(mesh.devices.flat)
        if any(not 0 <= p < len(flat) for p in self.positions):
            raise RemoteError(
                f"program {self.name} runs on device positions {self.positions}, and its "
                f"slice has {len(flat)} devices",
                kind="invalid",
            )
        return HloExecutable(self, [flat[p] for p in self.positions])


class HloExecutable:
    """A compiled StableHLO program: called with the store's arrays, as a jitted
    function is, it returns its outputs as ``jax.Array`` s."""

    def __init__(self, prog: HloProgram, devices: list[jax.Device]) -> None:
        self.prog = prog
        self.devices = devices
        if devices[0].platform == "cpu":
            # LAPACK's kernels (linalg's custom calls) find their functions only once
            # initialized, as jax.export's call does: a program using them before would
            # end the host's process.
            from jax._src.lax import linalg

            linalg.initialize_lapack()
        options = xc.CompileOptions.ParseFromString(prog.options)
        build = options.executable_build_options
        replicas = max(1, int(build.num_replicas))
        partitions = max(1, int(build.num_partitions))
        if replicas * partitions != len(devices):
            raise RemoteError(
                f"program {prog.name} is compiled for {replicas} replicas x {partitions} "
                f"partitions and runs on {len(devices)} devices",
                kind="invalid",
            )
        ids = np.array([d.id for d in devices]).reshape(replicas, partitions)
        options.device_assignment = xc.DeviceAssignment.create(ids)
        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(prog.module)
            code = mlir.module_to_bytecode(module)
        self.loaded = devices[0].client.compile_and_load(
            code, xc.DeviceList(tuple(devices)), options
        )
        # A program of one device reports no shardings (its outputs are on that device),
        # one without results one for its empty tuple.
        ops = [s.SerializeToString() for s in self.out_op_shardings] if prog.out_shapes else []
        ops = ops or [b""] * len(prog.out_shapes)
        self._out = [sharding(devices, op) for op in ops]

    @property
    def in_op_shardings(self) -> list[Any]:
        return list(self.loaded.get_parameter_shardings() or [])

    @property
    def out_op_shardings(self) -> list[Any]:
        return list(self.loaded.get_output_shardings() or [])

    @property
    def output_shardings(self) -> list[Any]:
        return list(self._out)

    def memory_analysis(self) -> Any:
        return self.loaded.get_compiled_memory_stats()

    def cost_analysis(self) -> Any:
        return self.loaded.cost_analysis()

    def as_text(self) -> str:
        return "\n\n".join(m.to_string() for m in self.loaded.hlo_modules())

    def __call__(self, *args: jax.Array) -> list[jax.Array]:
        for i, a in enumerate(args):
            on: list[Any] = list(a.sharding._device_assignment)
            if on != self.devices:
                raise RemoteError(
                    f"argument {i} of {self.prog.name} lives on devices "
                    f"{[d.id for d in on]}; the program runs on "
                    f"{[d.id for d in self.devices]}",
                    kind="invalid",
                )
        results = self.loaded.execute_sharded(list(args))
        shards = results.disassemble_into_single_device_arrays()
        return [
            jax.make_array_from_single_device_arrays(shape, sh, parts)
            for shape, sh, parts in zip(self.prog.out_shapes, self._out, shards, strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        """What the proxy tells the JAX client of the executable beyond a probe's
        analysis: its parameters' and outputs' shardings (serialized ``OpSharding`` s),
        its code's size and its fingerprint."""
        fingerprint = self.loaded.fingerprint
        return {
            "in_shardings": [s.SerializeToString() for s in self.in_op_shardings],
            "out_shardings": [s.SerializeToString() for s in self.out_op_shardings],
            "code_bytes": int(self.loaded.size_of_generated_code_in_bytes()),
            "fingerprint": fingerprint if isinstance(fingerprint, bytes) else b"",
        }
