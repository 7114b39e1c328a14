"""Sockets behind one small interface.

Between processes every link (client ↔ controller ↔ hosts, client ↔ host, host ↔ host)
runs over :mod:`pathways_nb.wire._stream` (addresses ``tcp://host:port``, or
``ipc://@name`` for an endpoint bound to loopback), where a ZeroMQ hop's two I/O-thread
wake-ups would dominate each small message. Within one process (``inproc://name``: the
in-process test tier, where controller, hosts and client share one context) it is
ZeroMQ. Every socket is owned by one thread, which alone receives; other threads send
on a stream endpoint directly and reach a ZeroMQ socket through an :class:`Outbox`.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Iterator
from typing import Any

import zmq

from pathways_nb._core import BrokenError
from pathways_nb.wire._stream import StreamDealer, StreamRouter, _Endpoint

RouterSocket = zmq.Socket[Any] | StreamRouter
DealerSocket = zmq.Socket[Any] | StreamDealer
AnySocket = zmq.Socket[Any] | StreamRouter | StreamDealer

_inproc_counter = itertools.count()


def make_context() -> zmq.Context[Any]:
    """A fresh ZeroMQ context (one per process role, or one shared in-process)."""
    return zmq.Context()


def new_inproc_address(prefix: str) -> str:
    """A unique ``inproc://`` address in this process."""
    return f"inproc://{prefix}-{os.getpid()}-{next(_inproc_counter)}"


def _tune(sock: zmq.Socket[Any], max_bytes: int | None) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    # Never drop or block on a slow peer: queues are bounded by our own back-pressure.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if max_bytes is not None:
        # A hard guard far above the checked limit: past it ZeroMQ drops the peer
        # instead of buffering without end. Below it, decode() replies with an error.
        sock.setsockopt(zmq.MAXMSGSIZE, min(2 * max_bytes, 2**62))


def bind(
    ctx: zmq.Context[Any],
    kind: int,
    address: str,
    max_bytes: int | None = None,
) -> tuple[zmq.Socket[Any], str]:
    """Bind a socket; ``tcp://HOST:0`` picks a free port. Returns the socket and its address."""
    sock = ctx.socket(kind)
    _tune(sock, max_bytes)
    if kind == zmq.ROUTER:
        # Tell us (by an error on send) when a peer vanished instead of dropping silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if address.startswith("tcp://") and address.endswith(":0"):
        host = address[len("tcp://") : -2]
        port = sock.bind_to_random_port(f"tcp://{host}")
        return sock, f"tcp://{host}:{port}"
    sock.bind(address)
    return sock, address


def connect(
    ctx: zmq.Context[Any],
    kind: int,
    address: str,
    max_bytes: int | None = None,
    identity: bytes | None = None,
) -> zmq.Socket[Any]:
    """Connect a socket to ``address``."""
    sock = ctx.socket(kind)
    _tune(sock, max_bytes)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def bind_router(
    ctx: zmq.Context[Any], address: str, max_bytes: int | None = None
) -> tuple[RouterSocket, str]:
    """Bind the many-peer end of a link (a ROUTER): ZeroMQ for ``inproc://``, a stream
    endpoint for ``tcp://`` (``:0`` picks a free port; on loopback, a Unix socket) or
    ``ipc://``. Returns it and the address peers connect to."""
    if address.startswith("inproc://"):
        return bind(ctx, zmq.ROUTER, address, max_bytes)
    router = StreamRouter(address, max_bytes)
    return router, router.address


def connect_dealer(
    ctx: zmq.Context[Any],
    address: str,
    max_bytes: int | None = None,
    *,
    blocking: bool = False,
    peer: str = "the peer",
) -> DealerSocket:
    """Connect to a :func:`bind_router` end (as a DEALER); see
    :class:`~pathways_nb.wire._stream.StreamDealer` for ``blocking``. ``peer`` names the
    other side in the error raised when it cannot be reached."""
    if address.startswith("inproc://"):
        return connect(ctx, zmq.DEALER, address, max_bytes)
    try:
        return StreamDealer(address, max_bytes, blocking=blocking)
    except (OSError, ValueError) as exc:
        raise BrokenError(
            f"cannot reach {peer} at {address}: {exc}; is the cluster running and the "
            "address the one it reported?"
        ) from None


class Poller(zmq.Poller):
    """A ``zmq.Poller`` that also watches stream endpoints and reports them as themselves
    (a plain ``zmq.Poller`` reports an object polled by file descriptor as that number)."""

    def __init__(self) -> None:
        super().__init__()
        self._by_fd: dict[int, Any] = {}

    def register(self, socket: Any, flags: int = zmq.POLLIN | zmq.POLLOUT) -> None:
        if isinstance(socket, _Endpoint):
            self._by_fd[socket.fileno()] = socket
        super().register(socket, flags)

    def poll(self, timeout: int | None = None) -> list[tuple[Any, int]]:
        by_fd = self._by_fd
        return [(by_fd.get(s, s) if type(s) is int else s, e) for s, e in super().poll(timeout)]


def sends_from_any_thread(sock: AnySocket) -> bool:
    """Whether threads other than the owner may send on ``sock`` (a stream endpoint may;
    a ZeroMQ socket may not, and is reached through an :class:`Outbox`)."""
    return isinstance(sock, _Endpoint)


def peer_id(frame: Any) -> bytes:
    """The identity a ROUTER-like socket put first in a received message."""
    return bytes(frame.buffer) if isinstance(frame, zmq.Frame) else bytes(frame)


# Plain ints: pyzmq's enum flags cost microseconds per operation on the hot path.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_get = zmq.backend.Socket.get


def _readable(sock: zmq.Socket[Any]) -> bool:
    return bool(int(_get(sock, _EVENTS)) & _POLLIN)


def receive(sock: AnySocket, limit: int = 1000) -> Iterator[list[Any]]:
    """Messages waiting on ``sock`` now, at most ``limit``; never blocks.

    A stream endpoint parses what its connections hold (see :mod:`._stream`). A ZeroMQ
    socket is asked the socket whether a message is there before reading, instead of reading until
    ``zmq.Again``: an exception per drained socket is a real cost on the hot path.
    """
    if isinstance(sock, _Endpoint):
        yield from sock.receive(limit)
        return
    for _ in range(limit):
        if not _readable(sock):
            return
        yield sock.recv_multipart(copy=False)


class Outbox:
    """Lets any thread hand work to the thread that owns a loop.

    Producers append ``(target, payload)`` to a deque; only the first item after the owner
    last drained also rings a bell (one byte on an ``inproc`` PUSH), so a burst of
    submissions costs one wake-up, not a socket send each. The owner polls :attr:`socket`
    beside its network sockets and calls :meth:`drain`.
    """

    def __init__(self, ctx: zmq.Context[Any], name: str) -> None:
        self.address = new_inproc_address(name)
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(self.address)
        self._push = ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.connect(self.address)
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._armed = False
        self._closed = False

    @property
    def socket(self) -> zmq.Socket[Any]:
        """The bell's PULL end, for the owner's poller."""
        return self._pull

    def send(self, target: bytes, payload: Any, wake: bool = True) -> None:
        """Queue ``payload`` for ``target``; safe from any thread.

        ``wake=False`` queues without ringing (safe even from ``__del__``): the owner picks
        it up at its next drain.
        """
        self._queue.append((target, payload))
        if wake and not self._armed:
            self._armed = True
            with self._lock:
                if not self._closed:
                    self._push.send(b"", copy=True)

    def empty(self) -> bool:
        """Whether nothing is queued (a snapshot: another thread may queue at once)."""
        return not self._queue

    def drain(self) -> list[tuple[bytes, Any]]:
        """Everything queued, oldest first. Only the owner calls this."""
        # Silence the bell before re-arming it, and re-arm before emptying the queue, so an
        # item queued at any moment is either in this drain or rings again.
        while _readable(self._pull):
            self._pull.recv()
        self._armed = False
        out = []
        q = self._queue
        while q:
            out.append(q.popleft())
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._push.close(0)
        self._pull.close(0)
