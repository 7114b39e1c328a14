"""TLS for the stream transport: the same framed messages, encrypted, for clusters whose
Dask deployment runs over TLS (contexts from ``distributed.security.Security``).

A :class:`TLSConn` is a stream connection (``_stream._Conn``) whose bytes pass through an
``ssl.SSLObject`` over two ``ssl.MemoryBIO`` buffers, while the socket stays the plain
non-blocking one the owner's epoll set watches. Not an ``ssl.SSLSocket``, for two reasons:
it has no ``sendmsg`` / ``recvmsg_into``, and plaintext it has decrypted but not yet handed
out sits inside it where epoll cannot see it, so a loop that waits on the descriptor could
sleep on a message that already arrived. Here every receive feeds all its ciphertext to
the TLS layer and decrypts everything that completes, at once: nothing hides from epoll.
A large message is decrypted straight into its aligned frames (see
``_recvpool.aligned_frames``): arrays land where a device can use them, as over a plain
link, without one more copy out of a parse buffer.

Sends queue plaintext, as the plain connection does, and encrypt it in bounded batches
only when the kernel has room for more: a 256 MiB array is never held twice in memory, and
what the kernel did not take waits as ciphertext until the socket is writable again.

The SSL object is not safe to use from two threads at once (OpenSSL's rule, and the
``_ssl`` module lets go of the GIL inside it), but the owner receives while other threads
send: each use holds :attr:`TLSConn._tls_lock`, only for the encryption or decryption and
never across a system call. Lock order: the connection's ``lock`` first, then this one.

Handshakes: a router's side is driven by its owner's loop, one receive at a time, so a
peer that connects and says nothing, speaks plaintext or fails verification stalls
nothing but itself; a failed handshake closes that connection (as junk does on a plain
link, its identity then appears in ``departed()`` although it never sent a message). A
dealer's side completes in its constructor, bounded by its timeout. In TLS 1.3 a client
finishes its handshake before the server has checked the client's certificate, so a
router first sends :data:`_ACK` (a message of no frames, which the plain framing never
sends) once it accepted the peer, and the dealer waits for it: a refused certificate
then fails the constructor, not a later send.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import cast

from pathways_nb.wire._addresses import format_tcp, parse_tcp
from pathways_nb.wire._stream import _BODY_TURN, _CHUNK, _Conn

# "PW" and a frame count of zero: the router's word that it accepted the peer.
_ACK = b"PW\x00\x00"
# Plaintext encrypted per batch, so a large array is sealed as the kernel takes it.
_SEAL = 1 << 18
# One TLS record's plaintext at most: smaller pieces (a message's head, small frames) are
# gathered into one record instead of one record each.
_RECORD = 1 << 14


def parse_tls(address: str) -> tuple[str, int]:
    """``tls://HOST:PORT`` (or ``tcp://HOST:PORT``) → ``(HOST, PORT)``."""
    if address.startswith("tls://"):
        address = "tcp://" + address[len("tls://") :]
    if not address.startswith("tcp://"):
        raise ValueError(
            f"a TLS stream endpoint needs an address like tls://127.0.0.1:5555; got {address!r}"
        )
    return parse_tcp(address)


def format_tls(host: str, port: int) -> str:
    """``(HOST, PORT)`` → ``tls://HOST:PORT`` (an IPv6 host in brackets)."""
    return "tls" + format_tcp(host, port)[len("tcp") :]


def listen(
    address: str, context: ssl.SSLContext | None, max_bytes: int | None
) -> tuple[socket.socket, str, Callable[[socket.socket, bytes], TLSConn]]:
    """A listening TCP socket for a router that speaks TLS, the ``tls://`` address peers
    dial, and what makes each accepted socket (and its identity) a connection.

    Always TCP, even on loopback: a dealer must be able to tell from the address that it
    has to encrypt, and TLS is asked for where links are not trusted anyway."""
    if context is None:
        raise ValueError(
            f"address {address!r} asks for TLS, but no TLS context was given: pass "
            "tls=security.get_listen_args('scheduler')['ssl_context'] (a "
            "distributed.security.Security), or bind a tcp:// address"
        )
    host, port = parse_tls(address)
    sock = socket.create_server((host, port), backlog=128)
    accepted = functools.partial(TLSConn, max_bytes=max_bytes, context=context, server_side=True)
    return sock, format_tls(host, sock.getsockname()[1]), accepted


def dial(
    address: str, context: ssl.SSLContext | None, max_bytes: int | None, timeout: float
) -> TLSConn:
    """A connection to a TLS router at ``tls://HOST:PORT``, its handshake completed (the
    router's acceptance included) within ``timeout`` seconds.

    Raises ``ssl.SSLError`` when the handshake fails (an unknown certificate authority,
    a refused client certificate), ``TimeoutError`` when it does not finish in time,
    ``ConnectionError`` when the peer closes or is not a TLS router.
    """
    if context is None:
        raise ValueError(
            f"address {address!r} asks for TLS, but no TLS context was given: pass "
            "tls=security.get_connection_args('client')['ssl_context'] (a "
            "distributed.security.Security)"
        )
    if not address.startswith("tls://"):
        raise ValueError(
            f"a TLS context was given, but {address!r} is not a tls://HOST:PORT address: "
            "dial the tls:// address the router reported (a process that encrypts never "
            "falls back to plaintext)"
        )
    host, port = parse_tls(address)
    sock = socket.create_connection((host, port), timeout=timeout)
    conn = TLSConn(sock, b"", max_bytes, context, server_side=False, server_hostname=host)
    try:
        conn.handshake_as_client(address, timeout)
    except BaseException:
        conn.close()
        raise
    return conn


class TLSConn(_Conn):
    """A stream connection that speaks TLS (see the module's doc). Messages, limits,
    Ctrl-C handling and closing behave as on the plain connection it extends."""

    def __init__(
        self,
        sock: socket.socket,
        ident: bytes,
        max_bytes: int | None,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        super().__init__(sock, ident, max_bytes)
        self._bio_in = ssl.MemoryBIO()
        self._bio_out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._bio_in, self._bio_out, server_side=server_side, server_hostname=server_hostname
        )
        self._tls_lock = threading.Lock()
        # Past the handshake (and, on a router, past queueing the acceptance): from then
        # on queued plaintext is encrypted and received ciphertext decrypted.
        self.ready = False
        # Ciphertext the kernel has not taken yet; _out holds plaintext not yet encrypted.
        self._wire = memoryview(b"")
        self._small = bytearray()  # small pieces gathered into one record
        self._scratch = bytearray(_RECORD)
        self._scratch_view = memoryview(self._scratch)
        # Messages that came with the router's acceptance: the first read's.
        self._early: list[list[memoryview]] = []

    # reading ------------------------------------------------------------------------
    def _read(self) -> list[list[memoryview]]:
        msgs: list[list[memoryview]] = []
        if self._early:
            msgs, self._early = self._early, []
        taken = 0
        while not self.closed and taken < _BODY_TURN:
            chunk = self._recv()
            if chunk is None:
                break
            taken += len(chunk)
            if self.ready:
                with self._tls_lock:
                    self._bio_in.write(chunk)
                    self._decrypt(msgs)
            else:
                self._handshake_step(chunk)
                if self.ready:  # a message may have come right behind the handshake
                    with self._tls_lock:
                        self._decrypt(msgs)
            if len(chunk) < _CHUNK and self._frames is None:
                break
        return msgs

    def _decrypt(self, msgs: list[list[memoryview]]) -> None:
        """Decrypt all that the TLS layer holds: a large message's bytes straight into
        its frames, others through the parse buffer. Called with ``_tls_lock`` held."""
        while not self.closed:
            if self._frames is not None:
                if not self._fill(msgs):
                    return
                continue
            try:
                # (typeshed says bytes: with a buffer it is the count read into it)
                n = cast(int, self._tls.read(_RECORD, self._scratch))
            except ssl.SSLWantReadError:
                return
            except ssl.SSLError:
                n = 0  # a record that does not decrypt, or the peer's alert
            if not n:  # the peer closed its TLS session, or the stream is broken
                self.closed = True
                return
            self._in += self._scratch_view[:n]
            self._parse(msgs)

    def _fill(self, msgs: list[list[memoryview]]) -> bool:
        """Decrypt into the large message's current frame until it is full or the TLS
        layer has no more; whether there may be more. A read yields one record (16 KiB)
        at most, so the frames' bookkeeping is done once per frame, not per record."""
        assert self._frames is not None
        frame = self._frames[self._at]
        read = self._tls.read
        start = filled = self._filled
        more = True
        try:
            while filled < len(frame):
                n = cast(int, read(len(frame) - filled, frame[filled:]))
                if not n:  # the peer closed its TLS session
                    self.closed, more = True, False
                    break
                filled += n
        except ssl.SSLWantReadError:
            more = False
        except ssl.SSLError:
            self.closed, more = True, False
        if filled > start:
            self._advance(filled - start, msgs)
        return more

    def _handshake_step(self, chunk: bytes) -> None:
        """A router's handshake, as far as ``chunk`` takes it; on success the
        acceptance is queued first, before anything sent meanwhile. A failure tells the
        peer why (TLS's alert, best effort) and closes this connection only."""
        with self.lock:
            with self._tls_lock:
                self._bio_in.write(chunk)
                try:
                    self._tls.do_handshake()
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    self.closed = True
                else:
                    self.ready = True
                    self._out.appendleft(memoryview(_ACK))
                alert = self._bio_out.read() if self.closed else b""
            if alert:
                with contextlib.suppress(OSError):
                    self.sock.send(alert)
            self.flush()

    def handshake_as_client(self, address: str, timeout: float) -> None:
        """A dealer's handshake, blocking; returns once the router accepted this peer."""
        deadline = time.monotonic() + timeout
        tls = self._tls
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._exchange(address, deadline)
            ack = b""
            while len(ack) < len(_ACK):
                try:
                    got = tls.read(len(_ACK) - len(ack))
                except ssl.SSLWantReadError:
                    self._exchange(address, deadline)
                    continue
                if not got:
                    raise ConnectionError(
                        f"the TLS peer at {address} ended the session before accepting "
                        "this one: is it a pathways stream router?"
                    )
                ack += got
            if ack != _ACK:
                raise ConnectionError(
                    f"the TLS peer at {address} answered {ack!r}, not a pathways stream "
                    "router's acceptance: is the address the one the router reported?"
                )
            self.ready = True
            with self._tls_lock:
                self._decrypt(self._early)
            self._send_now(deadline)
        except ssl.SSLError:
            # Tell the router why (TLS's alert), so it does not wait on this peer.
            with contextlib.suppress(OSError):
                self._send_now(deadline)
            raise
        except TimeoutError:
            raise TimeoutError(
                f"the TLS handshake with {address} did not finish within {timeout:g} s: is "
                "a TLS stream router listening there, with its owner's loop running?"
            ) from None
        finally:
            if self.sock.fileno() >= 0:
                self.sock.setblocking(False)

    def _send_now(self, deadline: float) -> None:
        """Send what the TLS layer has to say, blocking until ``deadline`` at most."""
        out = self._bio_out.read()
        if out:
            self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            self.sock.sendall(out)

    def _exchange(self, address: str, deadline: float) -> None:
        """One round of a dealer's handshake: send what the TLS layer has to say, feed
        it what comes back."""
        self._send_now(deadline)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        got = self.sock.recv(_CHUNK)
        if not got:
            raise ConnectionError(
                f"the peer at {address} closed the connection during the TLS handshake: "
                "does it speak TLS (a router bound with a TLS context)?"
            )
        self._bio_in.write(got)

    @property
    def greeted(self) -> bool:
        """A router's peer has spoken once its handshake is done (see _newcomers)."""
        return self.ready

    @property
    def has_unread(self) -> bool:
        return bool(self._unread) or bool(self._early)

    # writing ------------------------------------------------------------------------
    @property
    def wants_write(self) -> bool:
        if self._wire or (self.ready and self._out):
            return True
        with self._tls_lock:
            return self._bio_out.pending > 0  # e.g. a handshake's answer

    def flush(self) -> None:
        """Write what the kernel takes now, encrypting queued plaintext a batch at a
        time as it goes; keep the rest queued."""
        while not self.closed:
            if not self._wire:
                self._wire = memoryview(self._seal())
                if not self._wire:
                    return
            try:
                sent = self.sock.send(self._wire)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            self._wire = self._wire[sent:]

    def _seal(self) -> bytes:
        """Encrypt up to a batch of queued plaintext (none before the handshake); the
        ciphertext, with whatever the TLS layer itself has to send. Called with
        ``lock`` held."""
        out, small = self._out, self._small
        with self._tls_lock:
            try:
                budget = _SEAL if self.ready else 0
                while out and budget:
                    piece = out[0]
                    if len(piece) > budget:
                        out[0], piece = piece[budget:], piece[:budget]
                    else:
                        out.popleft()
                    budget -= len(piece)
                    if len(piece) < _RECORD:
                        small += piece
                        if len(small) < _RECORD:
                            continue
                        piece = memoryview(b"")
                    if small:
                        self._tls.write(small)
                        small.clear()
                    if piece:
                        self._tls.write(piece)
                if small:
                    self._tls.write(small)
                    small.clear()
            except ssl.SSLError:
                # Our peers never renegotiate: a write the TLS layer refuses means the
                # session is broken.
                self.closed = True
                small.clear()
                return b""
            return self._bio_out.read()

    def close(self) -> None:
        super().close()
        self._wire = memoryview(b"")
