"""Framed messages over plain sockets (TCP, or Unix on one machine): every link between
processes.

A message sent over ZeroMQ wakes four threads (ZeroMQ's I/O thread on each side, then
the receiver's own); here a send is one system call on the sending thread and the
receiver's loop wakes straight from the kernel. On this kind of machine (two busy cores)
that is ~100 µs per hop: measured with the same lean client → controller → host loops,
a round trip took 0.82-0.93 ms over these streams against 1.16-1.44 ms over ZeroMQ.

:class:`StreamRouter` (bound, many peers) and :class:`StreamDealer` (one connection)
behave as the ZeroMQ ROUTER and DEALER sockets they replace, for the methods the
package uses: ``send_multipart`` (a ROUTER's first frame names the peer; an unknown or
departed peer raises ``EHOSTUNREACH`` like a ROUTER with ``ROUTER_MANDATORY``),
:meth:`receive` and ``close``. Each exposes one file descriptor (an epoll instance over
its sockets) that a ``zmq.Poller`` watches beside ZeroMQ sockets. Like a ZeroMQ socket,
each is owned by one thread, which alone receives; unlike one, any thread may send. Sends
never block (unless asked to): what the kernel does not take at once waits in the
connection's queue and goes when the owner next services the socket.

On the wire a message is ``b"PW"``, its frame count (u16), each frame's length (u64),
then the frames. A stream that does not start that way is not ours: the connection is
closed, and only that connection.

Given a TLS context (``tls=``), both ends speak the same messages over TLS, on
``tls://HOST:PORT`` addresses (see ``_tls``, imported only by a process that encrypts).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import zmq

from pathways_nb.wire._addresses import dial, listen
from pathways_nb.wire._held import HELD, interrupts_deferred
from pathways_nb.wire._newcomers import GREET_SECONDS, Newcomers, Spare
from pathways_nb.wire._recvpool import aligned_frames

if TYPE_CHECKING:
    import ssl

__all__ = ["StreamDealer", "StreamRouter"]

_MAGIC = b"PW"
_HEAD = struct.Struct("<2sH")
_LEN = struct.Struct("<Q")
_MAX_FRAMES = 4096
_CHUNK = 1 << 18
# Bytes of one large body read per service turn, so the owner's other sockets get a turn.
_BODY_TURN = 16 << 20
_IOV_MAX = 512
_UNIX_SNDBUF = 4 << 20
# The size from which a received message's frames are aligned (see aligned_frames):
# below, its frames are copied out as one block.
_ALIGN_FROM = 1 << 16


def _split(body: memoryview, lens: list[int]) -> list[memoryview]:
    frames, at = [], 0
    for length in lens:
        frames.append(body[at : at + length])
        at += length
    return frames


class _Conn:
    """One TCP connection: parses incoming messages, queues what could not be sent yet."""

    def __init__(self, sock: socket.socket, ident: bytes, max_bytes: int | None) -> None:
        sock.setblocking(False)
        if sock.family == socket.AF_UNIX:
            # A Unix socket's buffer (~200 KiB by default) caps each write: ask for more,
            # so large arrays cross in fewer system calls (the kernel may grant less).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_SNDBUF)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.fd = sock.fileno()
        self.ident = ident
        # Past twice the endpoint's checked limit the peer is dropped (as ZeroMQ's
        # MAXMSGSIZE does); below it, decode() answers an oversized message with an error.
        self._hard_limit = 2 * max_bytes if max_bytes is not None else None
        self._in = bytearray()
        # A large message's frames being received in place (see aligned_frames): the
        # frames, the one being filled, and how much of it is.
        self._frames: list[memoryview] | None = None
        self._at = 0
        self._filled = 0
        self._out: collections.deque[memoryview] = collections.deque()
        # Messages a read completed when a Ctrl-C it held was raised: the next read's.
        self._unread: list[list[memoryview]] = []
        self.closed = False
        self.mask = select.EPOLLIN  # what the endpoint's epoll set watches for
        # Held while the outgoing queue changes: the owner flushes it, and a dealer may
        # also be sent on by other threads (see StreamDealer.send_multipart).
        self.lock = threading.Lock()

    @property
    def greeted(self) -> bool:
        """Whether the peer has spoken (see _newcomers): on a plain link, any bytes do."""
        return True

    # reading ------------------------------------------------------------------------
    def read(self) -> list[list[memoryview]]:
        """Complete messages that arrived; sets :attr:`closed` at end of stream or on junk.

        Small messages are parsed out of one receive buffer; a large message's frames are
        received straight into buffers of their own (see :func:`aligned_frames`), so an
        array is copied once, by the kernel, and lands where a device can use it.

        A Ctrl-C meanwhile (see ``_held``) waits for the count of what was received, and
        the messages completed are kept for the next read when it is raised.
        """
        if not HELD.enter():
            return self._read()
        msgs, self._unread = self._unread, []
        try:
            msgs += self._read()
        finally:
            self._unread = msgs
            HELD.exit()
        self._unread = []
        return msgs

    def _read(self) -> list[list[memoryview]]:
        msgs: list[list[memoryview]] = []
        taken = 0
        while not self.closed and taken < _BODY_TURN:
            if self._frames is not None:
                n = self._recv_frames(msgs)
                if n is None:
                    break
                taken += n
                continue
            chunk = self._recv()
            if chunk is None:
                break
            self._in += chunk
            taken += len(chunk)
            self._parse(msgs)
            if len(chunk) < _CHUNK and self._frames is None:
                break
        return msgs

    def _recv(self) -> bytes | None:
        """One receive of up to a chunk; None when nothing is there now, or at end of
        stream or on error (which close the connection)."""
        try:
            got = self.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            got = b""
        if not got:
            self.closed = True
            return None
        return got

    def _recv_frames(self, msgs: list[list[memoryview]]) -> int | None:
        """One scattered receive into the rest of the large message's frames, which go
        to ``msgs`` once full. The byte count; None as :meth:`_recv`."""
        frames = self._frames
        assert frames is not None
        views = [frames[self._at][self._filled :], *frames[self._at + 1 : self._at + _IOV_MAX]]
        try:
            got = self.sock.recvmsg_into(views)[0]
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            got = 0
        if not got:
            self.closed = True
            return None
        self._advance(got, msgs)
        return got

    def _advance(self, n: int, msgs: list[list[memoryview]]) -> None:
        """Count ``n`` more bytes into the large message's frames, in order; the
        message goes to ``msgs`` once they are full."""
        frames = self._frames
        assert frames is not None
        while n or (self._at < len(frames) and self._filled == len(frames[self._at])):
            room = len(frames[self._at]) - self._filled
            step = min(room, n)
            self._filled += step
            n -= step
            if self._filled == len(frames[self._at]):
                self._at, self._filled = self._at + 1, 0
        if self._at == len(frames):
            msgs.append(frames)
            self._frames = None

    def _parse(self, msgs: list[list[memoryview]]) -> None:
        buf = self._in
        pos = 0
        while len(buf) - pos >= _HEAD.size:
            magic, n = _HEAD.unpack_from(buf, pos)
            if magic != _MAGIC or not 0 < n <= _MAX_FRAMES:
                self.closed = True  # not our protocol: nothing after this can be trusted
                break
            body_at = pos + _HEAD.size + n * _LEN.size
            if len(buf) < body_at:
                break
            lens = list(struct.unpack_from(f"<{n}Q", buf, pos + _HEAD.size))
            total = sum(lens)
            if self._hard_limit is not None and total > self._hard_limit:
                self.closed = True
                break
            have = len(buf) - body_at
            if have >= total and total < _ALIGN_FROM:
                with memoryview(buf) as mv:
                    body = memoryview(bytes(mv[body_at : body_at + total]))
                msgs.append(_split(body, lens))
                pos = body_at + total
                continue
            if total < _ALIGN_FROM:
                break  # the rest comes in the next chunk
            # Big enough to carry arrays: its frames go where a device can use them.
            frames = aligned_frames(lens)
            take = min(have, total)
            at, end = body_at, body_at + take
            with memoryview(buf) as mv:
                for frame in frames:
                    if at >= end:
                        break
                    k = min(len(frame), end - at)
                    frame[:k] = mv[at : at + k]
                    at += k
            self._frames, self._at, self._filled = frames, 0, 0
            self._advance(take, msgs)
            if self._frames is None:
                pos = body_at + total
                continue
            pos = len(buf)
            break
        if pos:
            del buf[:pos]

    # writing ------------------------------------------------------------------------
    def send(self, frames: Sequence[Any]) -> None:
        head = bytearray(_HEAD.pack(_MAGIC, len(frames)))
        views = []
        for f in frames:
            v = memoryview(f.buffer if isinstance(f, zmq.Frame) else f).cast("B")
            head += _LEN.pack(len(v))
            views.append(v)
        was_empty = not self._out
        self._out.append(memoryview(head))
        self._out.extend(v for v in views if len(v))
        if was_empty:
            self.flush()

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    @property
    def has_unread(self) -> bool:
        return bool(self._unread)

    def flush(self) -> None:
        """Write what the kernel takes now; keep the rest queued."""
        out = self._out
        while out and not self.closed:
            batch = list(itertools.islice(out, _IOV_MAX))
            try:
                sent = self.sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            while sent:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = head[sent:]
                    sent = 0

    def close(self) -> None:
        self.closed = True
        self._out.clear()
        self.sock.close()


class _Endpoint:
    """What a router and a dealer share: an epoll set the owner's poller watches."""

    def __init__(self, max_bytes: int | None) -> None:
        self._max_bytes = max_bytes
        self._ep = select.epoll()
        self._conns: dict[int, _Conn] = {}  # fd -> connection
        # Held while connections come and go: a send from another thread may find its
        # connection broken and drop it while the owner accepts new ones.
        self._lock = threading.Lock()
        self._closed = False
        # A router's connections not heard from yet (see _newcomers); None on a dealer.
        self._newcomers: Newcomers | None = None

    def fileno(self) -> int:
        """Readable whenever one of this endpoint's sockets needs service."""
        return self._ep.fileno()

    def _add(self, conn: _Conn) -> None:
        with self._lock:
            self._conns[conn.fd] = conn
            self._ep.register(conn.fd, select.EPOLLIN)

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            if self._conns.get(conn.fd) is not conn:
                return  # dropped already, by the owner or by another thread's send
            del self._conns[conn.fd]
            with contextlib.suppress(OSError, ValueError):
                self._ep.unregister(conn.fd)
            self._gone(conn)
        conn.close()

    def _gone(self, conn: _Conn) -> None:
        """A connection closed (the peer left, or sent what is not ours)."""

    def _accept(self) -> bool:
        """Take new connections (routers only); whether there were any."""
        return False

    def _send_on(self, conn: _Conn, frames: Sequence[Any]) -> None:
        with conn.lock:
            conn.send(frames)
            self._sync_write(conn)

    def _sync_write(self, conn: _Conn) -> None:
        """Watch for room to write exactly while something waits to be sent; drop a
        closed connection. Called with ``conn.lock`` held."""
        if conn.closed:
            self._drop(conn)
            return
        mask = select.EPOLLIN | (select.EPOLLOUT if conn.wants_write else 0)
        if mask != conn.mask and self._conns.get(conn.fd) is conn:
            conn.mask = mask
            self._ep.modify(conn.fd, mask)

    def _events(self) -> list[tuple[int, int]]:
        return self._ep.poll(0) if not self._closed else []

    def receive(self, limit: int = 1000) -> Iterator[list[Any]]:
        """Messages that arrived, at most about ``limit``; never blocks. Also sends
        what waited for room and accepts new peers."""
        count = 0
        accepted = False
        for fd, ev in self._events():
            conn = self._conns.get(fd)
            if conn is None:
                accepted = self._accept()
                continue
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                for frames in conn.read():
                    count += 1
                    yield self._framed(conn, frames)
                if self._newcomers:
                    self._newcomers.heard(conn)
            with conn.lock:
                if ev & select.EPOLLOUT:
                    conn.flush()
                self._sync_write(conn)
            if count >= limit:
                return
        if accepted:  # a new peer's first message is often there already
            yield from self.receive(limit - count)

    def _framed(self, conn: _Conn, frames: list[memoryview]) -> list[Any]:
        return frames

    def close(self, linger: int | None = None) -> None:
        """Close every connection; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        self._ep.close()


class StreamRouter(_Endpoint):
    """A listening endpoint: every accepted connection is a peer named by an identity,
    which comes first in each received message and names the target of each send.

    With ``tls`` (a server-side ``ssl.SSLContext``) it listens on TCP, loopback included,
    and :attr:`address` reads ``tls://HOST:PORT``; its owner's loop drives each peer's
    handshake, and a failed one closes that connection only. A peer that has said nothing
    (or not finished its handshake) within ``greet_within`` seconds is closed, and running
    out of descriptors turns newcomers away rather than waking the loop for ever (see
    ``_newcomers``)."""

    def __init__(
        self,
        address: str,
        max_bytes: int | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        greet_within: float = GREET_SECONDS,
    ) -> None:
        super().__init__(max_bytes)
        self._new_conn: Callable[[socket.socket, bytes], _Conn]
        if tls is None and not address.startswith("tls://"):
            self._listener, self.address = listen(address)
            self._new_conn = functools.partial(_Conn, max_bytes=max_bytes)
        else:
            from pathways_nb.wire import _tls

            self._listener, self.address, self._new_conn = _tls.listen(address, tls, max_bytes)
        self._listener.setblocking(False)
        self._ep.register(self._listener.fileno(), select.EPOLLIN)
        self._newcomers = Newcomers(greet_within)
        self._spare = Spare()
        self._by_ident: dict[bytes, _Conn] = {}
        self._next = itertools.count(1)
        # Identities of peers whose connections closed, until the owner asks (departed);
        # None until it first asks, so a router nobody asks keeps no list.
        self._departed: list[bytes] | None = None

    def _accept(self) -> bool:
        took = False
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return took
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    return took  # the peer sees a reset
                # Out of descriptors (see _newcomers): free one, or turn the peer away.
                silent = self._newcomers.oldest() if self._newcomers else None
                if silent is None:
                    self._spare.shed(self._listener)
                    return took
                self._drop(cast(_Conn, silent))
                continue
            took = True
            conn = self._new_conn(sock, b"\x00" + next(self._next).to_bytes(4, "big"))
            self._by_ident[conn.ident] = conn
            self._add(conn)
            if self._newcomers is not None:
                self._newcomers.arrived(conn)

    def receive(self, limit: int = 1000) -> Iterator[list[Any]]:
        if self._newcomers:
            for conn in self._newcomers.overdue():
                self._drop(cast(_Conn, conn))
        yield from super().receive(limit)

    def _gone(self, conn: _Conn) -> None:
        if self._newcomers is not None:
            self._newcomers.forget(conn)
        self._by_ident.pop(conn.ident, None)
        if self._departed is not None:
            self._departed.append(conn.ident)

    def departed(self) -> list[bytes]:
        """The identities of peers whose connections closed since the last call: a
        process that ended, or one that closed its socket. The first call starts the
        count (and returns nothing). A ZeroMQ ROUTER cannot tell."""
        with self._lock:
            out, self._departed = self._departed or [], []
        return out

    def _framed(self, conn: _Conn, frames: list[memoryview]) -> list[Any]:
        return [memoryview(conn.ident), *frames]

    def send_multipart(self, frames: Sequence[Any], copy: bool = False) -> None:
        """Send ``frames[1:]`` to the peer named by ``frames[0]``; safe from any thread."""
        ident = frames[0]
        conn = self._by_ident.get(bytes(ident.buffer if isinstance(ident, zmq.Frame) else ident))
        if conn is None or conn.closed:
            raise zmq.ZMQError(errno.EHOSTUNREACH, "that peer is not connected")
        self._send_on(conn, frames[1:])

    def close(self, linger: int | None = None) -> None:
        if not self._closed:
            self._listener.close()
            self._spare.close()
        super().close(linger)


class StreamDealer(_Endpoint):
    """One connection to a :class:`StreamRouter`. Once the router is gone, receives
    yield nothing and sends are dropped, as with a ZeroMQ DEALER whose peer left;
    :attr:`connected` then reads False (a ZeroMQ DEALER's owner learns it only from
    timeouts and heartbeats).

    ``blocking=True`` is for a thread that owns the dealer but runs no loop around it
    (a waiting caller, a transfer sender): a send returns once the kernel holds all of
    it, and :meth:`poll` / :meth:`recv_multipart` wait for answers.

    A ``tls://`` address needs ``tls`` (a client-side ``ssl.SSLContext``), and ``tls``
    needs one; the handshake completes here, within ``timeout``, or raises an
    ``OSError`` (``ssl.SSLError`` when verification failed) saying what went wrong.
    """

    def __init__(
        self,
        address: str,
        max_bytes: int | None = None,
        *,
        blocking: bool = False,
        timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(max_bytes)
        self._conn: _Conn | None
        if tls is None and not address.startswith("tls://"):
            self._conn = _Conn(dial(address, timeout), b"", max_bytes)
        else:
            from pathways_nb.wire import _tls

            self._conn = _tls.dial(address, tls, max_bytes, timeout)
        self._add(self._conn)
        self._blocking = blocking
        self._backlog: collections.deque[list[Any]] = collections.deque()

    def _gone(self, conn: _Conn) -> None:
        self._conn = None

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def send_buffer(self) -> int:
        """Bytes of messages the kernel takes at once, without the peer reading them
        (half its doubled ``SO_SNDBUF``); 0 once the connection is gone."""
        conn = self._conn
        if conn is None or conn.closed:
            return 0
        return int(conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)) // 2

    def send_multipart(self, frames: Sequence[Any], copy: bool = False) -> None:
        """Send one message. Unlike a ZeroMQ socket's, this is safe from any thread
        (the owner alone receives): a caller may send without handing over to the owner.
        A Ctrl-C meanwhile waits for the count of what was sent (see ``_held``)."""
        conn = self._conn
        if conn is None:
            return
        with interrupts_deferred():
            self._send_on(conn, frames)
            if self._blocking and conn.wants_write:
                # What the kernel did not take at once goes with the socket blocking, so
                # a large array leaves in as few system calls as the kernel allows.
                with conn.lock:
                    conn.sock.setblocking(True)
                    try:
                        conn.flush()
                    finally:
                        if not conn.closed:
                            conn.sock.setblocking(False)
                    self._sync_write(conn)

    def receive(self, limit: int = 1000) -> Iterator[list[Any]]:
        self._take_unread()  # after what the backlog holds already, as they came
        while self._backlog:
            yield self._backlog.popleft()
        yield from super().receive(limit)

    def poll(self, timeout: int | None = None) -> int:
        """Wait up to ``timeout`` ms (None: for ever) for a message; ``POLLIN`` if one came."""
        if not self._backlog and not self._closed:
            self._take_unread()
        if not self._backlog and not self._closed:
            self._ep.poll(-1 if timeout is None else timeout / 1000)
            self._backlog.extend(super().receive())
        return zmq.POLLIN if self._backlog else 0

    def _take_unread(self) -> None:
        """Messages a read completed before a Ctrl-C it held was raised: no event will
        announce them again."""
        conn = self._conn
        if conn is not None and conn.has_unread:
            self._backlog.extend(conn.read())

    def recv_multipart(self, copy: bool = True) -> list[Any]:
        """The next message, waiting for it; ``ConnectionError`` once the router is gone."""
        while not self._backlog:
            if self._conn is None:
                raise ConnectionError("the peer closed the connection")
            self.poll(None)
        return self._backlog.popleft()
