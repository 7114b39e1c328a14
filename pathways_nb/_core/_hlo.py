"""The bytes of a program of kind ``"hlo"``: StableHLO that plain JAX lowered, with the
XLA compile options it chose, sent by the IFRT proxy and compiled by a host."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgpack

HLO_BLOB_VERSION = 1


@dataclasses.dataclass(frozen=True)
class HloBlob:
    """``module``: a StableHLO portable artifact; ``options``: a serialized
    ``xla.CompileOptionsProto``; ``positions``: the program's devices, by position among
    its slice's; ``outputs``: each output's shape and encoded dtype."""

    module: bytes
    options: bytes
    positions: tuple[int, ...]
    outputs: tuple[tuple[tuple[int, ...], Any], ...]

    def pack(self) -> bytes:
        return bytes(
            msgpack.packb(
                {
                    "v": HLO_BLOB_VERSION,
                    "module": self.module,
                    "options": self.options,
                    "positions": list(self.positions),
                    "outs": [[list(s), d] for s, d in self.outputs],
                },
                use_bin_type=True,
            )
        )

    @classmethod
    def unpack(cls, blob: bytes) -> HloBlob:
        """Raises ValueError for bytes that are not such a program."""
        try:
            h = msgpack.unpackb(blob, raw=False)
        except Exception as exc:
            raise ValueError(f"not msgpack: {exc}") from None
        if not isinstance(h, dict) or h.get("v") != HLO_BLOB_VERSION:
            raise ValueError(f"not a version {HLO_BLOB_VERSION} StableHLO program")
        try:
            return cls(
                bytes(h["module"]),
                bytes(h["options"]),
                tuple(int(p) for p in h["positions"]),
                tuple((tuple(int(n) for n in s), d) for s, d in h["outs"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed StableHLO program: {exc!r}") from None


def op_sharding(data: bytes) -> Any:
    """XLA's ``OpSharding`` from its serialized bytes (empty: replicated)."""
    from jax._src.lib import xla_client as xc

    op = xc.OpSharding()
    if data:
        op.ParseFromString(data)
    else:
        op.type = xc.OpSharding.Type.REPLICATED
    return op


def hlo_blob(
    module: bytes,
    options: bytes,
    positions: Sequence[int],
    outputs: Sequence[tuple[tuple[int, ...], Any]],
) -> bytes:
    return HloBlob(module, options, tuple(positions), tuple(outputs)).pack()
