"""Frames ↔ messages.

A message is one msgpack header (a map with a string type under ``"t"``) followed by
zero or more raw buffer frames: array payloads travel as their own frames, so neither
side copies them into the header.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgpack

from pathways_nb._core import ProtocolError

Buffer = bytes | memoryview


@dataclasses.dataclass
class Message:
    """A decoded message: ``header["t"]`` is its type; ``buffers`` are raw payloads."""

    header: dict[str, Any]
    buffers: list[Buffer] = dataclasses.field(default_factory=list)

    @property
    def type(self) -> str:
        return str(self.header["t"])


def encode(header: dict[str, Any], buffers: Sequence[Buffer] = ()) -> list[Buffer]:
    """Frames for ``header`` and ``buffers``."""
    return [msgpack.packb(header, use_bin_type=True), *buffers]


def encode_batch(packed: Sequence[bytes]) -> bytes:
    """One ``batch`` header frame holding already-packed headers under ``"msgs"``.

    msgpack values concatenate, so the packed headers go in as they are, unparsed; the
    receiver unpacks the whole batch in one call.
    """
    p = msgpack.Packer(use_bin_type=True)
    head = p.pack_map_header(2) + p.pack("t") + p.pack("batch") + p.pack("msgs")
    return bytes(head + p.pack_array_header(len(packed)) + b"".join(packed))


def pack(header: dict[str, Any]) -> bytes:
    """A header packed on its own, for :func:`encode_batch`."""
    return bytes(msgpack.packb(header, use_bin_type=True))


def decode(frames: Sequence[Any], max_bytes: int | None = None) -> Message:
    """Parse frames into a :class:`Message`, or raise :class:`ProtocolError` saying why."""
    if not frames:
        raise ProtocolError("empty message: expected a msgpack header frame")
    if max_bytes is not None:
        total = sum(len(f) for f in frames)
        if total > max_bytes:
            raise ProtocolError(
                f"message of {total} bytes is larger than this endpoint accepts ({max_bytes}); "
                "send arrays in smaller pieces or raise the limit in pathways_nb.Config"
            )
    first = frames[0]
    raw = first.buffer if hasattr(first, "buffer") else first
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"header frame is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError(
            "header must be a msgpack map with a string type under 't'; "
            f"got {type(header).__name__}"
        )
    return Message(header, [f.buffer if hasattr(f, "buffer") else f for f in frames[1:]])
