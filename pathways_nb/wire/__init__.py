"""The wire protocol: message schema, codec, ZeroMQ sockets and the version handshake.

Imports nothing from the rest of the package except ``pathways_nb._core``.
"""

from pathways_nb.wire._codec import Message, decode, encode, encode_batch, pack
from pathways_nb.wire._messages import SCHEMAS, check
from pathways_nb.wire._transport import (
    Outbox,
    bind,
    connect,
    make_context,
    new_inproc_address,
    receive,
)

__all__ = [
    "SCHEMAS",
    "Message",
    "Outbox",
    "bind",
    "check",
    "connect",
    "decode",
    "encode",
    "encode_batch",
    "make_context",
    "new_inproc_address",
    "pack",
    "receive",
]
