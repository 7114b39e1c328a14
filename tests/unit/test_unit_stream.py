"""The stream transport: framed messages over TCP, routed like ZeroMQ's ROUTER/DEALER."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from _interrupts import SigintAfter, interrupts_held
from _streams import departures, gather, gather_interrupted

from pathways_nb._core import BrokenError
from pathways_nb.wire import (
    Outbox,
    Poller,
    connect_dealer,
    departed,
    peer_id,
    receive,
)
from pathways_nb.wire._addresses import dial, format_tcp, parse_tcp
from pathways_nb.wire._stream import StreamDealer, StreamRouter


@pytest.fixture
def router() -> Iterator[StreamRouter]:
    r = StreamRouter("tcp://127.0.0.1:0", max_bytes=1 << 20)
    yield r
    r.close()


def test_messages_are_routed_by_peer_and_keep_their_frames(router: StreamRouter) -> None:
    a = StreamDealer(router.address)
    b = StreamDealer(router.address)
    a.send_multipart([b"from a", b"", b"\x00" * 3])
    b.send_multipart([b"from b"])
    got = gather(router, n=2)
    by_text = {m[1]: m for m in got}
    assert by_text[b"from a"][2:] == [b"", b"\x00\x00\x00"]
    router.send_multipart([by_text[b"from b"][0], b"to b", b"second"])
    router.send_multipart([by_text[b"from a"][0], b"to a"])
    assert gather(b, n=1) == [[b"to b", b"second"]]
    assert gather(a, n=1) == [[b"to a"]]
    a.close()
    b.close()
    a.close()  # twice is fine


def test_poller_reports_stream_endpoints_as_themselves(router: StreamRouter) -> None:
    d = StreamDealer(router.address)
    d.send_multipart([b"x"])
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    ready = dict(poller.poll(5000))
    assert router in ready
    d.close()


@pytest.mark.parametrize("with_zmq", [False, True])
def test_poller_watches_endpoints_bells_and_zmq_sockets_together(
    router: StreamRouter, with_zmq: bool
) -> None:
    """Without a ZeroMQ socket the poller is one epoll object; with one it is a
    zmq.Poller; both report each ready object as the one registered."""
    ctx = zmq.Context()
    box = Outbox()
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(box.socket, zmq.POLLIN)
    poller.register(box.socket, zmq.POLLIN)  # again: no change, as with zmq.Poller
    pull = push = None
    if with_zmq:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind("inproc://poller-test")
        push.connect("inproc://poller-test")
        poller.register(pull, zmq.POLLIN)
    assert poller.poll(0) == []
    box.send(b"t", 1)
    box.send(b"t", 2)  # one ring for a burst
    assert dict(poller.poll(1000)) == {box.socket: zmq.POLLIN}
    assert box.drain() == [(b"t", 1), (b"t", 2)]
    assert poller.poll(0) == []  # draining silenced the bell
    d = StreamDealer(router.address)
    d.send_multipart([b"x"])
    assert router in dict(poller.poll(5000))
    if push is not None and pull is not None:
        push.send(b"y")
        deadline = time.monotonic() + 5
        while pull not in dict(poller.poll(100)):
            assert time.monotonic() < deadline
        pull.close(0)
        push.close(0)
    with pytest.raises(ValueError, match="input only"):
        poller.register(router, zmq.POLLOUT)
    d.close()
    box.close()
    box.close()  # twice is fine
    poller.close()
    ctx.term()


def test_large_messages_arrive_whole_and_in_order_with_small_ones(router: StreamRouter) -> None:
    big = np.arange(3 << 19, dtype=np.uint8)  # many receive chunks, within the hard limit
    d = StreamDealer(router.address, blocking=True)

    def send() -> None:  # blocking sends return once the kernel holds them: not here
        d.send_multipart([b"before"])
        d.send_multipart([b"big", memoryview(big)])
        d.send_multipart([b"after"])

    sender = threading.Thread(target=send)
    sender.start()
    got = gather(router, n=3)
    sender.join()
    assert [m[1] for m in got] == [b"before", b"big", b"after"]
    np.testing.assert_array_equal(np.frombuffer(got[1][2], np.uint8), big)
    d.close()


def test_frames_of_messages_that_carry_arrays_arrive_aligned(router: StreamRouter) -> None:
    """Each frame of a message of 64 KiB or more starts on a 64-byte boundary (so XLA
    places arrays received in it without a copy), whether the message came in one
    receive or in many, with odd and empty frames among them; small ones need not."""
    rng = np.random.default_rng(0)
    one_chunk = [b"h" * 13, b"", rng.bytes(70_001), rng.bytes(3)]
    many_chunks = [b"x" * 5, rng.bytes(1 << 20), b"", rng.bytes(777_777)]
    d = StreamDealer(router.address, blocking=True)

    def send() -> None:
        d.send_multipart(one_chunk)
        d.send_multipart(many_chunks)
        d.send_multipart([b"small", b"y" * 7])

    sender = threading.Thread(target=send)
    sender.start()
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    got: list[list[Any]] = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        poller.poll(100)
        got.extend(receive(router))
    sender.join()
    assert [[bytes(f) for f in m[1:]] for m in got] == [
        one_chunk,
        many_chunks,
        [b"small", b"y" * 7],
    ]
    for message in got[:2]:
        for frame in message[1:]:
            if len(frame):
                assert np.frombuffer(frame, np.uint8).ctypes.data % 64 == 0
    d.close()


def test_sends_never_block_the_sender_and_go_once_the_peer_reads(router: StreamRouter) -> None:
    d = StreamDealer(router.address)
    payload = bytes(range(256)) * 4096  # 1 MiB, within the router's limit
    ident = None
    d.send_multipart([b"hello"])
    for m in gather(router, n=1):
        ident = m[0]
    assert ident is not None
    t = time.monotonic()
    for _ in range(64):  # far more than the kernel's socket buffers hold
        router.send_multipart([ident, payload])
    assert time.monotonic() - t < 5.0
    got = 0
    deadline = time.monotonic() + 30
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(d, zmq.POLLIN)
    while got < 64:
        assert time.monotonic() < deadline
        poller.poll(100)
        list(receive(router))  # the owner's turn writes what waited for room
        for m in receive(d):
            assert bytes(m[0]) == payload
            got += 1
    d.close()


def test_junk_closes_only_that_connection(router: StreamRouter) -> None:
    good = StreamDealer(router.address)
    good.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    raw = dial(router.address, 10)
    raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
    raw.settimeout(10)
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    closed = False
    deadline = time.monotonic() + 10
    while not closed:
        assert time.monotonic() < deadline
        poller.poll(100)
        assert list(receive(router)) == []
        try:
            raw.setblocking(False)
            closed = raw.recv(1) == b""
        except BlockingIOError:
            pass
    raw.close()
    router.send_multipart([ident, b"still here"])
    assert gather(good, n=1) == [[b"still here"]]
    good.close()


def test_a_departed_peer_is_unreachable_and_oversized_messages_drop_the_sender(
    router: StreamRouter,
) -> None:
    d = StreamDealer(router.address, blocking=True)
    d.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    # Past twice the router's 1 MiB limit; sent from a thread, as it blocks until read.
    sender = threading.Thread(target=d.send_multipart, args=([b"x" * (3 << 20)],))
    sender.start()
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline
        assert list(receive(router)) == []
        try:
            router.send_multipart([ident, b"anyone?"])
        except zmq.ZMQError as exc:
            assert exc.errno == errno.EHOSTUNREACH
            break
        time.sleep(0.01)
    sender.join(10)
    d.close()


def test_a_router_names_each_peer_that_left_once(router: StreamRouter) -> None:
    assert departed(router) == []  # the first call starts the count
    stays, leaves = StreamDealer(router.address), StreamDealer(router.address)
    stays.send_multipart([b"stays"])
    leaves.send_multipart([b"leaves"])
    idents = {m[1]: m[0] for m in gather(router, n=2)}
    assert departed(router) == []
    leaves.close()
    assert departures(router) == [idents[b"leaves"]]
    assert departed(router) == []  # reported once
    router.send_multipart([idents[b"stays"], b"still here"])
    assert gather(stays, n=1) == [[b"still here"]]
    stays.close()
    # A ZeroMQ ROUTER cannot tell who left: it reports no one.
    ctx = zmq.Context()
    zr = ctx.socket(zmq.ROUTER)
    assert departed(zr) == []
    zr.close(0)
    ctx.term()


def test_a_dealer_may_be_sent_on_from_other_threads_in_order(router: StreamRouter) -> None:
    d = StreamDealer(router.address)
    n = 2000

    def burst(tag: bytes) -> None:
        for i in range(n):
            d.send_multipart([tag, i.to_bytes(4, "big")])

    threads = [threading.Thread(target=burst, args=(t,)) for t in (b"a", b"b")]
    for t in threads:
        t.start()
    got = gather(router, n=2 * n)
    for t in threads:
        t.join()
    for tag in (b"a", b"b"):
        seq = [int.from_bytes(m[2], "big") for m in got if m[1] == tag]
        assert seq == list(range(n))
    d.close()


def test_connecting_to_nothing_says_what_was_unreachable() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(BrokenError, match=f"cannot reach the controller at tcp://127.0.0.1:{port}"):
        connect_dealer(zmq.Context.instance(), f"tcp://127.0.0.1:{port}", peer="the controller")


def test_peer_id_reads_zeromq_frames_and_stream_identities() -> None:
    assert peer_id(zmq.Frame(b"\x00ab")) == b"\x00ab"
    assert peer_id(memoryview(b"\x00cd")) == b"\x00cd"


def test_loopback_endpoints_are_unix_sockets_and_others_tcp() -> None:
    local = StreamRouter("tcp://127.0.0.1:0")
    anywhere = StreamRouter("tcp://0.0.0.0:0")
    try:
        assert local.address.startswith("ipc://@pathways-")
        assert anywhere.address.startswith("tcp://0.0.0.0:")
        for r in (local, anywhere):
            d = StreamDealer(r.address.replace("0.0.0.0", "127.0.0.1"))
            d.send_multipart([b"ping"])
            assert [m[1:] for m in gather(r, n=1)] == [[b"ping"]]
            d.close()
    finally:
        local.close()
        anywhere.close()


def test_tcp_addresses_parse_and_format_both_ways() -> None:
    assert parse_tcp("tcp://127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert parse_tcp("tcp://[::1]:7") == ("::1", 7)
    assert format_tcp("::1", 7) == "tcp://[::1]:7"
    with pytest.raises(ValueError, match="expected an address like tcp://"):
        parse_tcp("inproc://x")


def test_a_router_may_be_sent_on_from_other_threads_in_order(router: StreamRouter) -> None:
    d = StreamDealer(router.address)
    d.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    n = 2000

    def burst(tag: bytes) -> None:
        for i in range(n):
            router.send_multipart([ident, tag, i.to_bytes(4, "big")])

    threads = [threading.Thread(target=burst, args=(t,)) for t in (b"a", b"b")]
    for t in threads:
        t.start()
    got: list[list[bytes]] = []
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(d, zmq.POLLIN)
    deadline = time.monotonic() + 30
    while len(got) < 2 * n:
        assert time.monotonic() < deadline, f"got {len(got)} of {2 * n}"
        poller.poll(100)
        list(receive(router))  # the owner writes what waited for room
        got.extend([bytes(f) for f in m] for m in receive(d))
    for t in threads:
        t.join()
    for tag in (b"a", b"b"):
        assert [int.from_bytes(m[1], "big") for m in got if m[0] == tag] == list(range(n))
    d.close()


def test_a_dealer_reports_what_its_kernel_buffer_takes_at_once(router: StreamRouter) -> None:
    d = StreamDealer(router.address)
    room = d.send_buffer()
    assert room > 0
    # A message of half that size leaves at once, with nobody reading on the other side:
    # nothing stays queued in the dealer.
    d.send_multipart([np.zeros(room // 2, np.uint8)])
    assert d._conn is not None and not d._conn.wants_write
    d.close()
    assert d.send_buffer() == 0


@pytest.fixture
def held() -> Iterator[None]:
    with interrupts_held():
        yield


@pytest.mark.usefixtures("held")
def test_ctrl_c_waits_for_the_count_of_what_a_send_or_a_receive_took(
    router: StreamRouter,
) -> None:
    d = StreamDealer(router.address)
    d.send_multipart([b"hello"])
    (first,) = gather(router, n=1)
    peer = first[0]
    conn = d._conn
    assert conn is not None
    real = conn.sock
    # A send: the interrupt comes once the message is counted as gone, and it goes once.
    conn.sock = SigintAfter(real, "sendmsg")  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        d.send_multipart([b"one", b"x" * 100_000])
    conn.sock = real
    assert not conn.wants_write or gather(router, n=0) == []
    d.send_multipart([b"two"])
    got = gather(router, n=2)
    assert [m[1] for m in got] == [b"one", b"two"] and len(got[0][2]) == 100_000
    # A receive: the bytes taken are counted before the interrupt, so the next message
    # still parses.
    big = np.arange(1 << 18, dtype=np.float32)  # received straight into its own frames
    conn.sock = SigintAfter(real, "recvmsg_into")  # type: ignore[assignment]
    router.send_multipart([peer, b"array", big.tobytes()])
    router.send_multipart([peer, b"after"])
    out, interrupts = gather_interrupted(d, n=2)
    assert interrupts >= 1
    assert [m[0] for m in out] == [b"array", b"after"]
    np.testing.assert_array_equal(np.frombuffer(out[0][1], np.float32), big)
    d.close()
