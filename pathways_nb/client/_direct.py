"""Per-thread sockets to hosts, for ``fetch`` and ``block_until_ready``.

A thread that waits for values talks to the hosts itself: the request leaves and the
answer arrives on the waiting thread's own DEALER, with no hand-off through the IO thread
in either direction. Launches still leave through the IO thread, which keeps their order.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from pathways_nb._core import (
    NO_TLS,
    BrokenError,
    ClosedError,
    ProtocolError,
    RemoteError,
    TLSContexts,
    VersionMismatchError,
)
from pathways_nb.wire import (
    DealerSocket,
    Poller,
    connect_dealer,
    decode,
    encode,
    peer_gone,
    receive,
)

Reply = tuple[dict[str, Any], list[Any]]

# How long a host has to answer a new connection's hello.
_HANDSHAKE_SECONDS = 30.0
_GONE_GRACE_SECONDS = 5.0


class RequestFailed(Exception):
    """The host answered request ``index`` with the error its array holds (for a request
    of many arrays, the array at ``item`` of it)."""

    def __init__(self, index: int, error: RemoteError, item: int = 0) -> None:
        super().__init__(index, error, item)
        self.index = index
        self.error = error
        self.item = item


class DirectChannels:
    """Sockets owned by the threads that use them; closed together by :meth:`close`."""

    def __init__(self, ctx: zmq.Context[Any], tls: TLSContexts = NO_TLS) -> None:
        self._ctx = ctx
        self._tls = tls
        # The hello that opens each connection (the client's tenant and token in it),
        # set once the controller has welcomed the client.
        self.hello: dict[str, Any] = {}
        self._local = threading.local()
        self._all: list[DealerSocket] = []
        self._lock = threading.Lock()
        self._rids = itertools.count(1)
        self._closed = False
        # Times each address was forgotten (its host lost): a thread's socket connected
        # before the last of them is closed by that thread when it next asks for one.
        self._forgotten: dict[str, int] = {}
        self._forgets = 0
        # Seconds a wait goes on once a host's connection closed under it, for the
        # controller to say why (the host lost: the array's data is gone) before the
        # wait says so itself.
        self.gone_grace = _GONE_GRACE_SECONDS

    def forget(self, address: str) -> None:
        """The host at ``address`` was lost: each thread closes its socket there on its
        next request, instead of keeping it until the client closes."""
        with self._lock:
            self._forgets += 1
            self._forgotten[address] = self._forgets

    @property
    def sockets(self) -> int:
        """Sockets open to hosts, over all threads."""
        with self._lock:
            return len(self._all)

    def _socket(self, address: str, check: Callable[[], None]) -> DealerSocket:
        socks: dict[str, tuple[DealerSocket, int]] | None = getattr(self._local, "socks", None)
        if socks is None:
            socks = self._local.socks = {}
        seen: int = getattr(self._local, "forgets", 0)
        if seen != self._forgets:
            self._local.forgets = self._close_forgotten(socks)
        got = socks.get(address)
        if got is not None and not peer_gone(got[0]):
            return got[0]
        if got is not None:  # its host went away: a restarted one listens anew
            self._discard({address})
        with self._lock:
            if self._closed:
                raise ClosedError("the client was closed")
            made = self._forgets
            sock = connect_dealer(
                self._ctx,
                address,
                blocking=True,
                peer="a host",
                tls=self._tls,
            )
            self._all.append(sock)
        try:
            self._handshake(sock, address, check)
        except BaseException:
            with self._lock:
                if sock in self._all:
                    self._all.remove(sock)
            sock.close(0)
            raise
        socks[address] = (sock, made)
        return sock

    def _handshake(self, sock: DealerSocket, address: str, check: Callable[[], None]) -> None:
        rid = next(self._rids)
        sock.send_multipart(encode({**self.hello, "rid": rid}))
        deadline = time.monotonic() + _HANDSHAKE_SECONDS
        while not sock.poll(100):
            check()  # a host lost meanwhile never answers
            if time.monotonic() > deadline:
                raise BrokenError(
                    f"host at {address} did not answer the handshake within "
                    f"{_HANDSHAKE_SECONDS:.0f} s"
                )
        h = decode(sock.recv_multipart()).header
        if h["t"] == "refuse":
            raise VersionMismatchError(f"host at {address} refused this client: {h.get('reason')}")
        if h["t"] != "welcome":
            raise ProtocolError(f"host at {address} answered the handshake with {h['t']!r}")

    def _close_forgotten(self, socks: dict[str, tuple[DealerSocket, int]]) -> int:
        """Close this thread's sockets to hosts forgotten since they connected; return
        the forget count this thread has now seen."""
        with self._lock:
            now = self._forgets
            stale = [a for a, (_, made) in socks.items() if self._forgotten.get(a, 0) > made]
            for a in stale:
                sock = socks.pop(a)[0]
                self._all.remove(sock)
                sock.close(0)
        return now

    def request(
        self,
        requests: Sequence[tuple[str, dict[str, Any]]],
        check: Callable[[], None],
    ) -> list[Reply]:
        """Send every ``(address, header)``; return the replies in the same order.

        ``check()`` runs every 100 ms while waiting; it raises to stop the wait (the
        client closed, a host was lost). A failed reply raises :class:`RequestFailed`
        with the request's index and its RemoteError.
        """
        order: dict[int, int] = {}
        waiting: dict[int, tuple[str, DealerSocket]] = {}
        gone_at: float | None = None
        # One request (one host: the common case) waits on its socket alone; an epoll
        # object made and closed for it costs three system calls per wait.
        poller = Poller() if len(requests) > 1 else None
        only: DealerSocket | None = None
        try:
            for i, (address, header) in enumerate(requests):
                sock = self._socket(address, check)
                rid = next(self._rids)
                order[rid] = i
                waiting[rid] = (address, sock)
                sock.send_multipart(encode({**header, "rid": rid}), copy=False)
                if poller is not None:
                    poller.register(sock, zmq.POLLIN)
                else:
                    only = sock
            out: list[Reply | None] = [None] * len(requests)
            missing = len(requests)
            checked = time.monotonic()
            while missing:
                if only is None:
                    assert poller is not None
                    ready = poller.poll(100)
                else:
                    ready = [(only, zmq.POLLIN)] if only.poll(100) else []
                now = time.monotonic()
                if not ready or now - checked >= 0.1:
                    # Also while sockets are busy: a dead host's may stay readable.
                    check()
                    checked = now
                    gone = [a for a, sock in waiting.values() if peer_gone(sock)]
                    if gone and gone_at is None:
                        gone_at = now
                    elif gone and gone_at is not None and now - gone_at > self.gone_grace:
                        # Its answer cannot come on a closed connection, and no word
                        # came from the controller (gone too, or unreachable).
                        self._discard(set(gone))
                        raise BrokenError(
                            f"the host at {gone[0]} closed its connection before it "
                            "answered (did its process end?), and the controller said "
                            "nothing of it: check the cluster (client.status()), or "
                            "connect a new pw.Client if it is gone"
                        )
                if not ready:
                    continue
                for sock, _ in ready:
                    for frames in receive(sock, 10_000):
                        msg = decode(frames)
                        rid = msg.header.get("rid", -1)
                        waiting.pop(rid, None)
                        i = order.pop(rid, -1)
                        if i < 0:
                            continue  # an answer to a wait that was interrupted earlier
                        h = msg.header
                        if h["t"] == "failed":
                            error = RemoteError.from_dict(h.get("error") or {})
                            item = h.get("index", 0)
                            raise RequestFailed(i, error, item if type(item) is int else 0)
                        if h["t"] == "error":
                            raise ProtocolError(h.get("message", ""))
                        out[i] = (h, msg.buffers)
                        missing -= 1
        except KeyboardInterrupt:
            # It may have come between a receive and the bookkeeping of what it took
            # (a large answer arrives over many receives): the connection's state is
            # unknown, so this thread's next request to these hosts opens a new one.
            self._discard({address for address, _ in requests})
            raise
        finally:
            if poller is not None:
                poller.close()
        return [r for r in out if r is not None]

    def _discard(self, addresses: set[str]) -> None:
        """Close this thread's sockets to ``addresses``; new ones are made when needed."""
        socks: dict[str, tuple[DealerSocket, int]] = getattr(self._local, "socks", {})
        for address in addresses:
            got = socks.pop(address, None)
            if got is None:
                continue
            with self._lock:
                if got[0] in self._all:
                    self._all.remove(got[0])
            got[0].close(0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._all = self._all, []
        for s in socks:
            s.close(0)
