"""Sockets behind one small interface.

Between processes every link (client ↔ controller ↔ hosts, client ↔ host, host ↔ host)
runs over :mod:`pathways_nb.wire._stream` (addresses ``tcp://host:port``, or
``ipc://@name`` for an endpoint bound to loopback, or ``tls://host:port`` for one given a
TLS context), where a ZeroMQ hop's two I/O-thread
wake-ups would dominate each small message. Within one process (``inproc://name``: the
in-process test tier, where controller, hosts and client share one context) it is
ZeroMQ. Every socket is owned by one thread, which alone receives; other threads send
on a stream endpoint directly and reach a ZeroMQ socket through an :class:`Outbox`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import select
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import zmq

from pathways_nb._core import BrokenError, TLSContexts
from pathways_nb.wire._stream import StreamDealer, StreamRouter, _Endpoint

RouterSocket = zmq.Socket[Any] | StreamRouter
DealerSocket = zmq.Socket[Any] | StreamDealer
AnySocket = zmq.Socket[Any] | StreamRouter | StreamDealer

if TYPE_CHECKING:
    import ssl

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
    ctx: zmq.Context[Any],
    address: str,
    max_bytes: int | None = None,
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[RouterSocket, str]:
    """Bind the many-peer end of a link (a ROUTER): ZeroMQ for ``inproc://``, a stream
    endpoint for ``tcp://`` (``:0`` picks a free port; on loopback, a Unix socket) or
    ``ipc://``. Returns it and the address peers connect to.

    With ``tls`` (a server-side ``ssl.SSLContext``, such as
    ``Security.get_listen_args("scheduler")["ssl_context"]``) the stream endpoint speaks
    TLS over TCP and the address returned is ``tls://HOST:PORT``."""
    if address.startswith("inproc://"):
        _refuse_tls(address, tls)
        return bind(ctx, zmq.ROUTER, address, max_bytes)
    router = StreamRouter(address, max_bytes, tls=tls)
    return router, router.address


def _refuse_tls(address: str, tls: ssl.SSLContext | None) -> None:
    if tls is not None:
        raise ValueError(
            f"a TLS context was given for {address!r}, but inproc:// links stay inside "
            "this process and are never encrypted: pass tls=None for them, or use a "
            "tcp:// address to bind (tls:// to connect)"
        )


def connect_dealer(
    ctx: zmq.Context[Any],
    address: str,
    max_bytes: int | None = None,
    *,
    blocking: bool = False,
    peer: str = "the peer",
    tls: ssl.SSLContext | TLSContexts | None = None,
) -> DealerSocket:
    """Connect to a :func:`bind_router` end (as a DEALER); see
    :class:`~pathways_nb.wire._stream.StreamDealer` for ``blocking``. ``peer`` names the
    other side in the error raised when it cannot be reached, a failed TLS handshake
    included. A ``tls://`` address needs ``tls``, a client-side ``ssl.SSLContext`` such
    as ``Security.get_connection_args("client")["ssl_context"]``, or a process's
    :class:`~pathways_nb._core.TLSContexts`, which picks the context for the address."""
    if isinstance(tls, TLSContexts):
        tls = tls.for_address(address, peer)
    if not dealer_sends_from_any_thread(address):
        _refuse_tls(address, tls)
        return connect(ctx, zmq.DEALER, address, max_bytes)
    try:
        return StreamDealer(address, max_bytes, blocking=blocking, tls=tls)
    except (OSError, ValueError) as exc:
        raise BrokenError(
            f"cannot reach {peer} at {address}: {exc}; is the cluster running and the "
            "address the one it reported?"
        ) from None


class Poller:
    """Waits on stream endpoints, :class:`Bell` objects and ZeroMQ sockets together and
    reports each ready one as the object that was registered.

    Without a ZeroMQ socket among them (every loop whose links run between processes) it
    is one epoll object: a ``zmq.Poller`` costs several microseconds more per call,
    paid on every wake-up of every loop.
    """

    def __init__(self) -> None:
        self._by_fd: dict[int, Any] = {}
        self._ep = select.epoll()
        self._zmq: zmq.Poller | None = None

    def register(self, obj: Any, flags: int = zmq.POLLIN) -> None:
        """Watch ``obj`` for input (the only event the package's loops wait for)."""
        if flags != zmq.POLLIN:
            raise ValueError(f"a Poller watches for input only (zmq.POLLIN); got flags {flags}")
        if isinstance(obj, zmq.Socket):
            self._zmq_poller().register(obj, zmq.POLLIN)
            return
        fd = obj.fileno()
        if fd in self._by_fd:
            return  # registering again changes nothing, as with zmq.Poller
        self._by_fd[fd] = obj
        self._ep.register(fd, select.EPOLLIN)
        if self._zmq is not None:
            self._zmq.register(fd, zmq.POLLIN)

    def unregister(self, obj: Any) -> None:
        """Stop watching ``obj`` (before closing it); one not watched is ignored."""
        if isinstance(obj, zmq.Socket):
            if self._zmq is not None:
                with contextlib.suppress(KeyError):
                    self._zmq.unregister(obj)
            return
        fd = obj.fileno()
        if self._by_fd.pop(fd, None) is None:
            return
        self._ep.unregister(fd)
        if self._zmq is not None:
            self._zmq.unregister(fd)

    def _zmq_poller(self) -> zmq.Poller:
        if self._zmq is None:
            self._zmq = zmq.Poller()
            for fd in self._by_fd:
                self._zmq.register(fd, zmq.POLLIN)
        return self._zmq

    def poll(self, timeout: int | None = None) -> list[tuple[Any, int]]:
        """The ready objects, waiting at most ``timeout`` milliseconds (None: forever)."""
        by_fd = self._by_fd
        if self._zmq is None:
            wait = -1.0 if timeout is None or timeout < 0 else timeout / 1000
            return [(by_fd[fd], _POLLIN) for fd, _ in self._ep.poll(wait)]
        return [(by_fd.get(s, s) if type(s) is int else s, e) for s, e in self._zmq.poll(timeout)]

    def close(self) -> None:
        self._ep.close()


class Bell:
    """A wake-up any thread may ring for a loop that polls it (an eventfd)."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def ring(self) -> None:
        # Under the lock: a ring racing close() must not write to a reused descriptor.
        with self._lock:
            if not self._closed:
                os.eventfd_write(self._fd, 1)

    def clear(self) -> None:
        """Silence it (the owner, before looking at what it was rung for)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)


def dealer_sends_from_any_thread(address: str) -> bool:
    """Whether the DEALER :func:`connect_dealer` makes for ``address`` takes sends from
    any thread (a stream between processes does; an ``inproc://`` ZeroMQ socket not)."""
    return not address.startswith("inproc://")


def send_buffer(sock: AnySocket) -> int:
    """Bytes a send on ``sock`` leaves without waiting for the peer to read (a stream
    dealer's kernel buffer); 0 where that is not known (ZeroMQ sockets)."""
    return sock.send_buffer() if isinstance(sock, StreamDealer) else 0


def peer_gone(sock: AnySocket) -> bool:
    """Whether a dealer's one peer is known to have left: a stream dealer whose
    connection closed (the peer's process ended). False where that cannot be known
    (ZeroMQ sockets, whose owners learn it from timeouts)."""
    return isinstance(sock, StreamDealer) and not sock.connected


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


def departed(sock: AnySocket) -> list[bytes]:
    """The peers of a router whose connections closed since the last call (the owner's
    thread). A stream router sees each one; a ZeroMQ ROUTER (in-process) sees none."""
    return sock.departed() if isinstance(sock, StreamRouter) else []


class Outbox:
    """Lets any thread hand work to the thread that owns a loop.

    Producers append ``(target, payload)`` to a deque; only the first item after the owner
    last drained also rings a :class:`Bell`, so a burst of submissions costs one wake-up,
    not one each. The owner polls :attr:`socket` beside its network sockets and calls
    :meth:`drain`.
    """

    def __init__(self) -> None:
        self._bell = Bell()
        self._queue: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._armed = False

    @property
    def socket(self) -> Bell:
        """The bell, for the owner's poller."""
        return self._bell

    def send(self, target: bytes, payload: Any, wake: bool = True) -> None:
        """Queue ``payload`` for ``target``; safe from any thread.

        ``wake=False`` queues without ringing (safe even from ``__del__``): the owner picks
        it up at its next drain.
        """
        self._queue.append((target, payload))
        if wake and not self._armed:
            self._armed = True
            self._bell.ring()

    def empty(self) -> bool:
        """Whether nothing is queued (a snapshot: another thread may queue at once)."""
        return not self._queue

    def drain(self) -> list[tuple[bytes, Any]]:
        """Everything queued, oldest first. Only the owner calls this."""
        # Silence the bell before re-arming it, and re-arm before emptying the queue, so an
        # item queued at any moment is either in this drain or rings again.
        self._bell.clear()
        self._armed = False
        out = []
        q = self._queue
        while q:
            out.append(q.popleft())
        return out

    def close(self) -> None:
        self._bell.close()
