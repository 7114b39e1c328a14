"""The wire protocol: message schema, codec, sockets and the version handshake.

Imports nothing from the rest of the package except ``pathways_nb._core``.
"""

from pathways_nb.wire._codec import Message, decode, encode, encode_batch, pack
from pathways_nb.wire._held import hold_interrupts_in_main_thread, interrupts_deferred
from pathways_nb.wire._messages import SCHEMAS, check
from pathways_nb.wire._transport import (
    AnySocket,
    DealerSocket,
    Outbox,
    Poller,
    RouterSocket,
    bind,
    bind_router,
    connect,
    connect_dealer,
    dealer_sends_from_any_thread,
    departed,
    make_context,
    new_inproc_address,
    peer_gone,
    peer_id,
    receive,
    send_buffer,
    sends_from_any_thread,
)

__all__ = [
    "SCHEMAS",
    "AnySocket",
    "DealerSocket",
    "Message",
    "Outbox",
    "Poller",
    "RouterSocket",
    "bind",
    "bind_router",
    "check",
    "connect",
    "connect_dealer",
    "dealer_sends_from_any_thread",
    "decode",
    "departed",
    "encode",
    "encode_batch",
    "hold_interrupts_in_main_thread",
    "interrupts_deferred",
    "make_context",
    "new_inproc_address",
    "pack",
    "peer_gone",
    "peer_id",
    "receive",
    "send_buffer",
    "sends_from_any_thread",
]
