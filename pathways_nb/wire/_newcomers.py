"""What a stream router does about peers that connect and say nothing, and about running
out of file descriptors.

Every peer of ours speaks at once: a client, a host or a sender opens each connection
with its hello (and, over TLS, completes its handshake first). A connection that has
said nothing, or not finished its TLS handshake, within :data:`GREET_SECONDS` is closed,
as ZeroMQ closes one whose handshake outlasts ``ZMQ_HANDSHAKE_IVL``: otherwise anyone who
can reach the port could hold the process's descriptors until it accepted no one else.

When ``accept`` fails for want of descriptors, the listening socket stays readable, and
a loop waiting on it would wake for ever without making progress. The router then closes
its oldest newcomer still silent and tries again, or, with none, lets go of a descriptor
kept in reserve to accept the waiting connection and close it at once (the peer sees its
connection closed, and may retry), the way event loops such as libuv's handle ``EMFILE``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Protocol

# Seconds a new connection has to say something (ZeroMQ's handshake interval is 30 s).
GREET_SECONDS = 30.0


class _Peer(Protocol):
    ident: bytes

    @property
    def greeted(self) -> bool: ...


class Newcomers:
    """The connections a router accepted and has not heard from yet, oldest first."""

    def __init__(self, within: float = GREET_SECONDS) -> None:
        self._within = within
        # ident -> (deadline, connection); arrival order is deadline order.
        self._waiting: dict[bytes, tuple[float, _Peer]] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def arrived(self, conn: _Peer) -> None:
        self._waiting[conn.ident] = (time.monotonic() + self._within, conn)

    def heard(self, conn: _Peer) -> None:
        """``conn`` had something to read: no newcomer any more once it has greeted."""
        if conn.greeted:
            self._waiting.pop(conn.ident, None)

    def forget(self, conn: _Peer) -> None:
        """``conn`` closed."""
        self._waiting.pop(conn.ident, None)

    def overdue(self) -> list[_Peer]:
        """Those past their deadline, taken off the list (the router closes them)."""
        now = time.monotonic()
        out = []
        for deadline, conn in self._waiting.values():
            if deadline > now:
                break
            out.append(conn)
        for conn in out:
            del self._waiting[conn.ident]
        return out

    def oldest(self) -> _Peer | None:
        """The oldest still silent, taken off the list; None if there is none."""
        for ident, (_, conn) in self._waiting.items():
            del self._waiting[ident]
            return conn
        return None


class Spare:
    """A descriptor kept in reserve, let go to turn away a connection the process has no
    descriptor for."""

    def __init__(self) -> None:
        self._fd = self._open()

    @staticmethod
    def _open() -> int:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1  # none to spare now; the next shed tries again

    def shed(self, listener: socket.socket) -> bool:
        """Accept one waiting connection and close it; whether one was turned away."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            sock, _ = listener.accept()
        except OSError:
            return False
        else:
            sock.close()
            return True
        finally:
            # After the close: the descriptor it frees is the one taken back.
            self._fd = self._open()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
