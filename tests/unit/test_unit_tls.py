"""The stream transport over TLS: the same messages and guarantees as the plain links,
with contexts made by ``distributed.security.Security`` as a TLS Dask cluster's are.

A dealer completes its handshake in its constructor while the router's owner loop drives
the router's side, so here a dealer is made on a helper thread while the test's thread
services the router (:func:`made_while_serving`), as the router's own process would.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pytest
import zmq
from _interrupts import SigintAfter, interrupts_held
from _streams import departures, gather, gather_interrupted

pytest.importorskip("cryptography")
from distributed.security import Security

from pathways_nb._core import BrokenError
from pathways_nb.wire import (
    Poller,
    bind_router,
    connect_dealer,
    dealer_sends_from_any_thread,
    departed,
    receive,
)
from pathways_nb.wire._stream import StreamDealer, StreamRouter

T = TypeVar("T")


@dataclass(frozen=True)
class Contexts:
    server: ssl.SSLContext  # a router's
    client: ssl.SSLContext  # a dealer's, from the same certificate authority
    stranger: ssl.SSLContext  # a dealer's from another cluster's authority
    no_cert: ssl.SSLContext  # trusts the right authority but shows no certificate


@pytest.fixture(scope="module")
def tls() -> Contexts:
    ours, theirs = Security.temporary(), Security.temporary()
    no_cert = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ours.tls_ca_file)
    no_cert.check_hostname = False
    return Contexts(
        server=ours.get_listen_args("scheduler")["ssl_context"],
        client=ours.get_connection_args("client")["ssl_context"],
        stranger=theirs.get_connection_args("client")["ssl_context"],
        no_cert=no_cert,
    )


@pytest.fixture
def router(tls: Contexts) -> Iterator[StreamRouter]:
    r = StreamRouter("tcp://127.0.0.1:0", tls=tls.server)
    yield r
    r.close()


def made_while_serving(router: StreamRouter, make: Callable[[], T], timeout: float = 10) -> T:
    """``make()`` on a helper thread while this thread services ``router`` (receiving
    nothing meanwhile); its result, or its exception raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["made"] = make()
        except BaseException as exc:
            box["error"] = exc

    maker = threading.Thread(target=run)
    maker.start()
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    deadline = time.monotonic() + timeout
    while maker.is_alive():
        assert time.monotonic() < deadline, "the dealer's handshake never finished"
        poller.poll(20)
        assert list(receive(router)) == []
    maker.join()
    poller.close()
    if "error" in box:
        raise box["error"]
    made: T = box["made"]
    return made


def dealer(router: StreamRouter, ctx: ssl.SSLContext, **kwargs: Any) -> StreamDealer:
    return made_while_serving(router, lambda: StreamDealer(router.address, tls=ctx, **kwargs))


def wait_until_gone(d: StreamDealer, router: StreamRouter, timeout: float = 10.0) -> None:
    """Service both until the dealer sees its connection closed."""
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(d, zmq.POLLIN)
    deadline = time.monotonic() + timeout
    while d.connected:
        assert time.monotonic() < deadline, "the connection was never closed"
        poller.poll(100)
        assert list(receive(router)) == []
        assert list(receive(d)) == []
    poller.close()


def still_served(router: StreamRouter, tls: Contexts) -> None:
    """A fresh peer's message reaches the router and the answer comes back."""
    d = dealer(router, tls.client)
    d.send_multipart([b"still", b"there?"])
    (msg,) = gather(router, n=1)
    assert msg[1:] == [b"still", b"there?"]
    router.send_multipart([msg[0], b"yes"])
    assert gather(d, router, n=1) == [[b"yes"]]
    d.close()


def test_a_tls_router_reports_a_tls_address_and_routes_both_ways(
    router: StreamRouter, tls: Contexts
) -> None:
    assert router.address.startswith("tls://127.0.0.1:")
    assert dealer_sends_from_any_thread(router.address)
    a, b = dealer(router, tls.client), dealer(router, tls.client)
    assert a.send_buffer() > 0
    a.send_multipart([b"from a", b"", b"\x00" * 3])
    b.send_multipart([b"from b"])
    by_text = {m[1]: m for m in gather(router, n=2)}
    assert by_text[b"from a"][2:] == [b"", b"\x00\x00\x00"]
    router.send_multipart([by_text[b"from b"][0], b"to b", b"second"])
    router.send_multipart([by_text[b"from a"][0], b"to a"])
    assert gather(b, n=1) == [[b"to b", b"second"]]
    assert gather(a, n=1) == [[b"to a"]]
    a.close()
    b.close()
    a.close()  # twice is fine


def test_many_pipelined_messages_arrive_in_order_both_ways(
    router: StreamRouter, tls: Contexts
) -> None:
    d = dealer(router, tls.client)
    n = 5000
    for i in range(n):
        d.send_multipart([b"up", i.to_bytes(4, "big")])
    got = gather(router, d, n=n)
    assert [int.from_bytes(m[2], "big") for m in got] == list(range(n))
    ident = got[0][0]
    for i in range(n):  # far more than the kernel takes at once: the rest waits for room
        router.send_multipart([ident, b"down", i.to_bytes(4, "big")])
    back = gather(d, router, n=n)
    assert [int.from_bytes(m[1], "big") for m in back] == list(range(n))
    d.close()


def test_large_messages_arrive_whole_in_aligned_frames(tls: Contexts) -> None:
    """As on a plain link, each frame of a message of 64 KiB or more starts on a 64-byte
    boundary, however the records and receives cut it; both directions."""
    router = StreamRouter("tcp://127.0.0.1:0", tls=tls.server)  # no size limit
    rng = np.random.default_rng(0)
    mixed = [b"x" * 5, rng.bytes(3 << 20), b"", rng.bytes(777_777)]
    huge = rng.integers(0, 255, 64 << 20, dtype=np.uint8)
    d = dealer(router, tls.client, blocking=True)

    def send() -> None:  # blocking sends return once the kernel holds them: not here
        d.send_multipart([b"before"])
        d.send_multipart(mixed)
        d.send_multipart([b"huge", huge])
        d.send_multipart([b"after"])

    sender = threading.Thread(target=send)
    sender.start()
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    got: list[list[Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < 4:
        assert time.monotonic() < deadline, f"got {len(got)} of 4 messages"
        poller.poll(100)
        got.extend(receive(router))
    sender.join()
    assert [bytes(f) for f in got[0][1:]] == [b"before"]
    assert [bytes(f) for f in got[1][1:]] == mixed
    assert bytes(got[2][1]) == b"huge"
    np.testing.assert_array_equal(np.frombuffer(got[2][2], np.uint8), huge)
    assert [bytes(f) for f in got[3][1:]] == [b"after"]
    for message in got[1:3]:
        for frame in message[1:]:
            if len(frame):
                assert np.frombuffer(frame, np.uint8).ctypes.data % 64 == 0
    # The other way: the router's sends wait in its queue and go as the owner services it.
    router.send_multipart([got[0][0], b"down", huge.data[: 5 << 20]])
    out: list[list[Any]] = []
    poller.register(d, zmq.POLLIN)
    while not out:
        assert time.monotonic() < deadline
        poller.poll(100)
        assert list(receive(router)) == []
        out.extend(receive(d))
    assert bytes(out[0][0]) == b"down"
    assert np.frombuffer(out[0][1], np.uint8).ctypes.data % 64 == 0
    np.testing.assert_array_equal(np.frombuffer(out[0][1], np.uint8), huge[: 5 << 20])
    d.close()
    poller.close()
    router.close()


def test_a_blocking_dealer_sends_and_waits_for_answers(router: StreamRouter, tls: Contexts) -> None:
    d = dealer(router, tls.client, blocking=True)
    d.send_multipart([b"question"])
    (msg,) = gather(router, n=1)
    router.send_multipart([msg[0], b"answer", b"!"])
    assert [bytes(f) for f in d.recv_multipart()] == [b"answer", b"!"]
    assert d.poll(0) == 0
    d.close()


def test_dealer_and_router_may_be_sent_on_from_several_threads_at_once(
    router: StreamRouter, tls: Contexts
) -> None:
    d = dealer(router, tls.client)
    d.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    n, tags = 1000, (b"a", b"b", b"c", b"d")

    def burst(tag: bytes) -> None:
        for i in range(n):
            d.send_multipart([tag, i.to_bytes(4, "big")])
            router.send_multipart([ident, tag, i.to_bytes(4, "big")])

    threads = [threading.Thread(target=burst, args=(t,)) for t in tags]
    for t in threads:
        t.start()
    up: list[list[bytes]] = []
    down: list[list[bytes]] = []
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(d, zmq.POLLIN)
    deadline = time.monotonic() + 30
    while len(up) < len(tags) * n or len(down) < len(tags) * n:
        assert time.monotonic() < deadline, f"got {len(up)} up and {len(down)} down"
        poller.poll(100)
        up.extend([bytes(f) for f in m[1:]] for m in receive(router))
        down.extend([bytes(f) for f in m] for m in receive(d))
    for t in threads:
        t.join()
    for tag in tags:
        assert [int.from_bytes(m[1], "big") for m in up if m[0] == tag] == list(range(n))
        assert [int.from_bytes(m[1], "big") for m in down if m[0] == tag] == list(range(n))
    d.close()
    poller.close()


def test_a_plaintext_dealer_is_dropped_and_the_tls_peers_go_on(
    router: StreamRouter, tls: Contexts
) -> None:
    good = dealer(router, tls.client)
    good.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    plain = StreamDealer(router.address.replace("tls://", "tcp://"))
    plain.send_multipart([b"hello in the clear"])
    wait_until_gone(plain, router)
    router.send_multipart([ident, b"still here"])
    assert gather(good, n=1) == [[b"still here"]]
    good.close()
    plain.close()


def test_peers_that_connect_and_say_nothing_stall_no_one(
    router: StreamRouter, tls: Contexts
) -> None:
    host, port = router.address.removeprefix("tls://").rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    halfway = socket.create_connection((host, int(port)))
    halfway.sendall(b"\x16\x03\x01\x02\x00")  # a handshake record's header, then nothing
    still_served(router, tls)
    silent.close()
    halfway.close()


def test_a_dealer_from_another_authority_fails_verification_and_the_router_goes_on(
    router: StreamRouter, tls: Contexts
) -> None:
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        dealer(router, tls.stranger)
    said = rf"cannot reach the controller at {re.escape(router.address)}: \[SSL: CERTIFICATE_VERIFY"
    with pytest.raises(BrokenError, match=said):
        made_while_serving(
            router,
            lambda: connect_dealer(
                zmq.Context.instance(), router.address, peer="the controller", tls=tls.stranger
            ),
        )
    still_served(router, tls)


def test_a_dealer_without_a_client_certificate_is_refused(
    router: StreamRouter, tls: Contexts
) -> None:
    with pytest.raises(ssl.SSLError, match=r"CERTIFICATE_REQUIRED|certificate required"):
        dealer(router, tls.no_cert)
    still_served(router, tls)


def test_a_cluster_held_to_tls_1_2_works_too() -> None:
    """In TLS 1.2 the client's handshake ends after the server's, not before."""
    v12 = ssl.TLSVersion.TLSv1_2
    sec = Security.temporary(tls_min_version=v12, tls_max_version=v12)
    router = StreamRouter("tcp://127.0.0.1:0", tls=sec.get_listen_args("worker")["ssl_context"])
    ctx = sec.get_connection_args("worker")["ssl_context"]
    d = made_while_serving(router, lambda: StreamDealer(router.address, tls=ctx))
    assert d._conn is not None and d._conn._tls.version() == "TLSv1.2"  # type: ignore[attr-defined]
    d.send_multipart([b"hi", b"x" * 100_000])
    (msg,) = gather(router, n=1)
    assert msg[1:] == [b"hi", b"x" * 100_000]
    router.send_multipart([msg[0], b"back"])
    assert gather(d, router, n=1) == [[b"back"]]
    d.close()
    router.close()


def test_dialing_a_router_that_does_not_speak_tls_says_so(tls: Contexts) -> None:
    plain = StreamRouter("tcp://0.0.0.0:0")
    address = plain.address.replace("tcp://0.0.0.0", "tls://127.0.0.1")
    try:
        with pytest.raises(ConnectionError, match="during the TLS handshake: does it speak TLS"):
            made_while_serving(plain, lambda: StreamDealer(address, tls=tls.client))
    finally:
        plain.close()


def test_a_handshake_nobody_answers_times_out(tls: Contexts) -> None:
    deaf = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody answers
    port = deaf.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.3 s"):
        StreamDealer(f"tls://127.0.0.1:{port}", tls=tls.client, timeout=0.3)
    assert time.monotonic() - t < 5
    deaf.close()


def test_tls_addresses_and_contexts_come_together(tls: Contexts) -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    with pytest.raises(ValueError, match="no TLS context was given"):
        StreamDealer("tls://127.0.0.1:1")
    with pytest.raises(ValueError, match="is not a tls://HOST:PORT address"):
        StreamDealer("tcp://127.0.0.1:1", tls=tls.client)
    with pytest.raises(BrokenError, match="no TLS context was given"):
        connect_dealer(ctx, "tls://127.0.0.1:1")
    with pytest.raises(ValueError, match="no TLS context was given"):
        StreamRouter("tls://127.0.0.1:0")
    with pytest.raises(ValueError, match="needs an address like tls://"):
        StreamRouter("ipc://@pathways-tls-test", tls=tls.server)
    with pytest.raises(ValueError, match="inproc:// links stay inside this process"):
        bind_router(ctx, "inproc://tls-test", tls=tls.server)
    with pytest.raises(ValueError, match="inproc:// links stay inside this process"):
        connect_dealer(ctx, "inproc://tls-test", tls=tls.client)
    # A tls:// address is fine to bind too, and so is bind_router's way.
    r, address = bind_router(ctx, "tls://127.0.0.1:0", tls=tls.server)
    assert isinstance(r, StreamRouter) and address.startswith("tls://127.0.0.1:")
    d = made_while_serving(r, lambda: connect_dealer(ctx, address, tls=tls.client))
    d.send_multipart([b"ok"])
    assert [m[1:] for m in gather(r, n=1)] == [[b"ok"]]
    d.close()
    r.close()


def test_junk_inside_a_session_closes_only_that_connection(
    router: StreamRouter, tls: Contexts
) -> None:
    good, bad = dealer(router, tls.client), dealer(router, tls.client)
    good.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    conn = bad._conn
    assert conn is not None
    with conn.lock:  # well encrypted, but not our framing
        conn._out.append(memoryview(b"GET / HTTP/1.1\r\n\r\n"))
        conn.flush()
    wait_until_gone(bad, router)
    router.send_multipart([ident, b"still here"])
    assert gather(good, n=1) == [[b"still here"]]
    good.close()
    bad.close()


def test_a_router_names_a_tls_peer_that_left(router: StreamRouter, tls: Contexts) -> None:
    assert departed(router) == []  # the first call starts the count
    stays, leaves = dealer(router, tls.client), dealer(router, tls.client)
    stays.send_multipart([b"stays"])
    leaves.send_multipart([b"leaves"])
    idents = {m[1]: m[0] for m in gather(router, n=2)}
    leaves.close()
    assert departures(router) == [idents[b"leaves"]]
    with pytest.raises(zmq.ZMQError) as unreachable:
        router.send_multipart([idents[b"leaves"], b"anyone?"])
    assert unreachable.value.errno == errno.EHOSTUNREACH
    router.send_multipart([idents[b"stays"], b"still here"])
    assert gather(stays, n=1) == [[b"still here"]]
    stays.close()


def test_an_oversized_message_drops_its_sender(tls: Contexts) -> None:
    router = StreamRouter("tcp://127.0.0.1:0", max_bytes=1 << 20, tls=tls.server)
    d = dealer(router, tls.client, blocking=True)
    d.send_multipart([b"hi"])
    ident = gather(router, n=1)[0][0]
    # Past twice the router's 1 MiB limit; sent from a thread, as it blocks until read.
    sender = threading.Thread(target=d.send_multipart, args=([b"x" * (3 << 20)],))
    sender.start()
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "the oversized sender was never dropped"
        poller.poll(20)
        assert list(receive(router)) == []
        try:
            router.send_multipart([ident, b"anyone?"])
        except zmq.ZMQError as exc:
            assert exc.errno == errno.EHOSTUNREACH
            break
    sender.join(10)
    d.close()
    poller.close()
    router.close()


@pytest.fixture
def held() -> Iterator[None]:
    with interrupts_held():
        yield


@pytest.mark.usefixtures("held")
def test_ctrl_c_waits_for_the_count_of_what_a_tls_send_or_receive_took(
    router: StreamRouter, tls: Contexts
) -> None:
    """A send or a receive cut in two would encrypt a record twice or lose one: the
    session would be broken for good, not just one message."""
    d = dealer(router, tls.client)
    d.send_multipart([b"hello"])
    peer = gather(router, n=1)[0][0]
    conn = d._conn
    assert conn is not None
    real = conn.sock
    conn.sock = SigintAfter(real, "send")  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        d.send_multipart([b"one", b"x" * 100_000])
    conn.sock = real
    d.send_multipart([b"two"])
    got = gather(router, d, n=2)
    assert [m[1] for m in got] == [b"one", b"two"] and len(got[0][2]) == 100_000
    big = np.arange(1 << 18, dtype=np.float32)  # decrypted straight into its own frames
    conn.sock = SigintAfter(real, "recv")  # type: ignore[assignment]
    router.send_multipart([peer, b"array", big.tobytes()])
    router.send_multipart([peer, b"after"])
    out, interrupts = gather_interrupted(d, router, n=2)
    conn.sock = real
    assert interrupts >= 1
    assert [m[0] for m in out] == [b"array", b"after"]
    np.testing.assert_array_equal(np.frombuffer(out[0][1], np.float32), big)
    d.close()
