"""The controller answers host-socket peers that may already be gone."""

from __future__ import annotations

import zmq

from pathways_nb._core import local_versions
from pathways_nb.controller import Controller
from pathways_nb.wire import bind_router, encode


def _controller() -> Controller:
    c = Controller()
    # The loop is not started: the test thread owns the host socket and calls the handler
    # as the loop would, with a peer identity that no connection holds.
    c._hosts, c.host_address = bind_router(c._ctx, "tcp://127.0.0.1:0")
    return c


def _close(c: Controller) -> None:
    c._hosts.close(0)
    c._ctx.term()


def test_messages_from_a_departed_unregistered_peer_are_dropped_not_raised() -> None:
    c = _controller()
    try:
        for frames in (
            encode({"t": "acks", "items": []}),  # "register first" goes to nobody
            [b"\xff not a message"],  # nor does the protocol error
            encode({"t": "register", "host": "h0", "versions": {"nope": 1}}),  # nor a refusal
        ):
            c._on_host_frames([b"gone-peer", *frames])
        assert not c.rm.hosts
    finally:
        _close(c)


def test_a_host_whose_connection_closed_as_it_registered_is_lost_at_once() -> None:
    c = _controller()
    try:
        register = {
            "t": "register",
            "host": "h0",
            "island": "island0",
            "devices": [0, 1],
            "data_address": "tcp://127.0.0.1:1",
            "process": "p0",
            "platform": "cpu",
            "versions": local_versions(with_export=False).to_dict(),
        }
        c._on_host_frames([b"gone-peer", *encode(register)])
        assert not c.rm.hosts["h0"].alive
        assert "h0" not in c._host_ident and b"gone-peer" not in c._ident_host
        assert [e[1] for e in c.events.since(0)][-2:] == ["host_join", "host_lost"]
    finally:
        _close(c)


def test_a_departed_peer_raises_on_the_socket_itself() -> None:
    # What the handlers guard against: the router refuses a peer it does not hold.
    c = _controller()
    try:
        try:
            c._hosts.send_multipart([b"gone-peer", *encode({"t": "welcome"})])
        except zmq.ZMQError as exc:
            assert exc.errno == zmq.EHOSTUNREACH
        else:
            raise AssertionError("a send to a departed peer went through")
    finally:
        _close(c)
