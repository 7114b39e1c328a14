"""A stream router closes peers that connect and say nothing, and keeps serving when its
process runs out of file descriptors."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pathways_nb.wire._addresses import dial
from pathways_nb.wire._stream import StreamDealer, StreamRouter


def _closed_by_peer(raw: socket.socket) -> bool:
    """Whether the other end closed ``raw`` (without blocking)."""
    if not select.select([raw], [], [], 0)[0]:
        return False
    try:
        return raw.recv(1) == b""
    except ConnectionResetError:
        return True


class _Loop:
    """The router's owner loop, run by the test: what it received so far."""

    def __init__(self, router: StreamRouter) -> None:
        self.router = router
        self.got: list[bytes] = []

    def until(self, done: Callable[[], bool], seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, "timed out"
            select.select([self.router], [], [], 0.02)
            self.got += [b"".join(bytes(f) for f in m[1:]) for m in self.router.receive()]


@pytest.fixture
def loop() -> Iterator[_Loop]:
    router = StreamRouter("tcp://127.0.0.1:0", greet_within=0.3)
    yield _Loop(router)
    router.close()


def test_a_peer_that_says_nothing_is_closed_and_those_that_spoke_stay(loop: _Loop) -> None:
    silent = dial(loop.router.address, 5)
    spoke = StreamDealer(loop.router.address)
    spoke.send_multipart([b"hello"])
    loop.until(lambda: b"hello" in loop.got)

    def tick() -> bool:  # keeps the loop turning, as other peers' traffic would
        spoke.send_multipart([b"tick"])
        return _closed_by_peer(silent)

    loop.until(tick)
    # The peer that spoke long ago and little since is served as before.
    spoke.send_multipart([b"still here"])
    loop.until(lambda: b"still here" in loop.got)
    assert spoke.connected and not _closed_by_peer(spoke._conn.sock)  # type: ignore[union-attr]
    silent.close()
    spoke.close()


def test_a_peer_that_never_finishes_its_tls_handshake_is_closed() -> None:
    pytest.importorskip("cryptography")
    from distributed.security import Security

    security = Security.temporary()
    server = security.get_listen_args("scheduler")["ssl_context"]
    client = security.get_connection_args("client")["ssl_context"]
    loop = _Loop(StreamRouter("tcp://127.0.0.1:0", tls=server, greet_within=0.3))
    try:
        host, port = loop.router.address.removeprefix("tls://").rsplit(":", 1)
        stalled = socket.create_connection((host, int(port)), timeout=5)
        stalled.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, and no more
        made: list[StreamDealer] = []
        # A dealer's handshake needs the router's loop turning: it dials from a thread.
        dialer = threading.Thread(
            target=lambda: made.append(StreamDealer(loop.router.address, tls=client))
        )
        dialer.start()
        loop.until(lambda: bool(made))
        dialer.join()
        dealer = made[0]

        def tick() -> bool:
            dealer.send_multipart([b"tick"])
            return _closed_by_peer(stalled)

        loop.until(tick)
        dealer.send_multipart([b"after"])
        loop.until(lambda: b"after" in loop.got)
        dealer.close()
        stalled.close()
    finally:
        loop.router.close()


# A router in a process of its own whose descriptors run out: it prints its address,
# answers each message "ok" until one says "done", and prints how often its loop woke.
_CHILD = textwrap.dedent(
    """
    import json, os, resource, select, sys, time
    from pathways_nb.wire._stream import StreamRouter

    router = StreamRouter("tcp://127.0.0.1:0", greet_within=60)
    print(router.address, flush=True)
    sys.stdin.readline()  # the parent is ready
    room = int(sys.argv[1])
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + room, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))
    wakeups, got = 0, []
    deadline = time.monotonic() + 20
    while b"done" not in got and time.monotonic() < deadline:
        if select.select([router], [], [], 0.05)[0]:
            wakeups += 1
        for m in router.receive():
            got.append(b"".join(bytes(f) for f in m[1:]))
            router.send_multipart([m[0], b"ok"])
    print(json.dumps({"wakeups": wakeups, "got": [g.decode() for g in got]}), flush=True)
    """
)


def _run_child(room: int, parent: Callable[[str], None]) -> dict[str, object]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(room)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        address = child.stdout.readline().strip()
        child.stdin.write("go\n")
        child.stdin.flush()
        parent(address)
        report: dict[str, object] = json.loads(child.stdout.readline())
        child.wait(30)
    finally:
        child.kill()
    return report


def test_out_of_descriptors_the_oldest_silent_peer_makes_room() -> None:
    silent: list[socket.socket] = []

    def parent(address: str) -> None:
        silent.extend(dial(address, 5) for _ in range(12))
        last = StreamDealer(address, blocking=True)
        last.send_multipart([b"done"])
        assert [bytes(f) for f in last.recv_multipart()] == [b"ok"]
        last.close()

    report = _run_child(4, parent)
    assert report["got"] == ["done"]
    # Woken only by what came: a listener left readable would wake it without end.
    assert isinstance(report["wakeups"], int) and report["wakeups"] < 200
    deadline = time.monotonic() + 10
    while not all(_closed_by_peer(s) for s in silent[:8]):
        assert time.monotonic() < deadline, "the oldest silent peers were not closed"
        time.sleep(0.02)
    for s in silent:
        s.close()


def test_out_of_descriptors_with_no_silent_peer_a_newcomer_is_turned_away() -> None:
    peers: list[StreamDealer] = []
    turned: list[socket.socket] = []

    def parent(address: str) -> None:
        # Every descriptor the child has room for goes to a peer that spoke.
        for i in range(4):
            peers.append(StreamDealer(address, blocking=True))
            peers[-1].send_multipart([f"peer {i}".encode()])
            assert [bytes(f) for f in peers[-1].recv_multipart()] == [b"ok"]
        turned.extend(dial(address, 5) for _ in range(3))
        deadline = time.monotonic() + 10
        while not all(_closed_by_peer(s) for s in turned):
            assert time.monotonic() < deadline, "the newcomers were not turned away"
            time.sleep(0.02)
        peers[0].send_multipart([b"done"])

    report = _run_child(4, parent)
    assert report["got"][-1] == "done" and "peer 0" in report["got"]  # type: ignore[index,operator]
    assert isinstance(report["wakeups"], int) and report["wakeups"] < 200
    for p in peers:
        p.close()
    for s in turned:
        s.close()
