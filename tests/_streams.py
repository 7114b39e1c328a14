"""Servicing stream endpoints in a test's own thread, for the transport's tests."""

from __future__ import annotations

import time
from typing import Any

import zmq

from pathways_nb.wire import Poller, departed, receive


def gather(*endpoints: Any, n: int, timeout: float = 10.0) -> list[list[bytes]]:
    """Service all ``endpoints`` until ``n`` messages arrived on the first (as bytes
    frames); the others are serviced so that what they queued goes out."""
    poller = Poller()
    for e in endpoints:
        poller.register(e, zmq.POLLIN)
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} messages"
        poller.poll(100)
        out.extend([bytes(f) for f in m] for m in receive(endpoints[0]))
        for other in endpoints[1:]:
            assert list(receive(other)) == []
    poller.close()
    return out


def gather_interrupted(
    dealer: Any, *others: Any, n: int, timeout: float = 10.0
) -> tuple[list[list[bytes]], int]:
    """Receive on ``dealer``, whose socket raises KeyboardInterrupt now and then, until
    ``n`` messages came or ``timeout`` passed, servicing ``others`` so that what they
    queued goes out: the messages (as bytes frames) and the interrupts counted."""
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    interrupts = 0
    while len(out) < n and time.monotonic() < deadline:
        try:
            for other in others:
                list(receive(other))
            dealer.poll(100)
            out.extend([bytes(f) for f in m] for m in receive(dealer))
        except KeyboardInterrupt:
            interrupts += 1
    return out, interrupts


def departures(router: Any, timeout: float = 10.0) -> list[bytes]:
    """Service ``router``, which is to receive nothing meanwhile, until it names peers
    that left; their identities."""
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    gone: list[bytes] = []
    deadline = time.monotonic() + timeout
    while not gone:
        assert time.monotonic() < deadline, "the closed connection was never noticed"
        poller.poll(100)
        assert list(receive(router)) == []
        gone = departed(router)
    poller.close()
    return gone
