"""The client's IO thread: it alone owns the loop and receives on every socket.

User calls hand frames to it through an Outbox and get :class:`Future` objects back.
Launches, deletions and put notes submitted while the thread was busy leave as one
``batch`` message. Where the controller link is a stream (between processes), a message
to the controller with nothing queued before it leaves from the calling thread itself,
which spares a thread hand-off on every call of a one-at-a-time loop. Shutdown order:
say goodbye, stop the loop, join, close sockets.
"""

from __future__ import annotations

import collections
import itertools
import logging
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
)
from pathways_nb.client._futures import Future
from pathways_nb.wire import (
    AnySocket,
    DealerSocket,
    Outbox,
    Poller,
    connect_dealer,
    decode,
    encode,
    encode_batch,
    hold_interrupts_in_main_thread,
    pack,
    peer_gone,
    receive,
    sends_from_any_thread,
)

log = logging.getLogger("pathways_nb.client")

_CONTROLLER = b"c"
_BATCHED = b"b"
_HOST = b"h"
_FORGET = b"f"
_MAX_BATCH = 512
# Deletions of this many bytes or more leave with the next message the calling thread
# sends itself, instead of waiting for the IO thread's next turn (up to 50 ms): a burst of
# launches that each drop a large array would otherwise keep all of them on the host.
_EAGER_DELETE_BYTES = 1 << 20
# Handles per delete message.
_MAX_DELETE = 4096


class IOThread:
    """Owns the controller DEALER and one DEALER per host data plane."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        controller_address: str,
        on_push: Callable[[dict[str, Any]], None],
        heartbeat: float,
        tls: TLSContexts = NO_TLS,
    ) -> None:
        self._ctx = ctx
        self._address = controller_address
        self._tls = tls
        # The calling thread sends to the controller and reads hosts' answers itself:
        # Ctrl-C must not land between a send or a receive and its count.
        hold_interrupts_in_main_thread()
        self._ctl = connect_dealer(
            ctx,
            controller_address,
            peer="the controller",
            tls=tls,
        )
        self._outbox = Outbox()
        # Held while messages to the controller leave, by the IO thread (a whole drain)
        # or by a caller sending directly, so the controller sees them in submission order.
        self._ctl_lock = threading.Lock()
        self._direct = sends_from_any_thread(self._ctl)
        # Deletions wait here, apart from the outbox, for the IO thread's next turn (or
        # a direct send, see _to_controller), with about how many bytes they free.
        self._deletes: collections.deque[int] = collections.deque()
        self._delete_bytes = 0
        self._hosts: dict[str, DealerSocket] = {}
        self._host_of_socket: dict[DealerSocket, str] = {}
        self._futures: dict[int, tuple[Future[Any], str | None]] = {}
        self._rids = itertools.count(1)
        self._lock = threading.Lock()
        self._on_push = on_push
        self._heartbeat = heartbeat
        self._poller = Poller()
        self._poller.register(self._ctl, zmq.POLLIN)
        self._poller.register(self._outbox.socket, zmq.POLLIN)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.broken: str | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="pathways-client-io", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._outbox.send(b"w", None)
        self._thread.join()
        self._ctl.close(0)
        for s in self._hosts.values():
            s.close(0)
        self._outbox.close()
        self._poller.close()
        self._fail_all(ClosedError("the client was closed"))

    # user-thread API ----------------------------------------------------------------
    def _new_future(self, host: str | None) -> tuple[int, Future[Any]]:
        fut: Future[Any] = Future()
        rid = next(self._rids)
        with self._lock:
            if self._stopping.is_set():
                fut.set_exception(ClosedError("the client was closed"))
            elif self.broken is not None:
                fut.set_exception(BrokenError(self.broken))
            else:
                self._futures[rid] = (fut, host)
        return rid, fut

    def request(self, header: dict[str, Any], bufs: Sequence[Any] = ()) -> Future[Any]:
        """Send to the controller; the future resolves with the reply header."""
        rid, fut = self._new_future(None)
        header["rid"] = rid
        self._to_controller(_CONTROLLER, encode(header, bufs))
        return fut

    def send(self, header: dict[str, Any], bufs: Sequence[Any] = ()) -> None:
        """Send to the controller without waiting for anything."""
        self._to_controller(_CONTROLLER, encode(header, bufs))

    def send_batched(self, header: dict[str, Any]) -> None:
        """Send a small header that may share a ``batch`` message with its neighbours."""
        packed = pack(header)
        self._to_controller(_BATCHED, [packed], packed)

    def _to_controller(self, kind: bytes, frames: list[Any], queued: Any = None) -> None:
        """Send now from this thread if nothing for the controller waits in the outbox,
        else queue behind what does (``queued`` is what the outbox holds, if not frames)."""
        if self._direct and self._outbox.empty():
            with self._ctl_lock:
                if self._outbox.empty() and not self._stopping.is_set():
                    if self._delete_bytes >= _EAGER_DELETE_BYTES:
                        # Safe ahead of this message: every launch that reads a deleted
                        # array was handed off before its deletion, and with the outbox
                        # empty under this lock, all of those have left.
                        self._send_deletes()
                    self._safe_send(self._ctl, frames)
                    return
        self._outbox.send(kind, frames if queued is None else queued)

    def host_request(
        self, address: str, header: dict[str, Any], bufs: Sequence[Any] = ()
    ) -> Future[Any]:
        """Send to the host at ``address``; resolves with its reply (``array`` frames too)."""
        rid, fut = self._new_future(address)
        header["rid"] = rid
        self._outbox.send(_HOST + address.encode(), encode(header, bufs))
        return fut

    def fail_host(self, address: str, error: Exception) -> None:
        """Fail every request waiting on the host at ``address`` (it was lost)."""
        with self._lock:
            dead = [rid for rid, (_, h) in self._futures.items() if h == address]
            futs = [self._futures.pop(rid)[0] for rid in dead]
        for f in futs:
            if not f.done():
                f.set_exception(error)

    def forget_host(self, address: str) -> None:
        """Close the IO thread's socket to the host at ``address`` (it was lost) on its
        next turn; a later send there connects afresh."""
        self._outbox.send(_FORGET + address.encode(), None)

    @property
    def host_sockets(self) -> int:
        """Sockets the IO thread holds to hosts."""
        return len(self._hosts)

    # the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:
            # A bug here must not leave the client waiting for ever on a dead thread:
            # everything waiting hears it, and every later call raises BrokenError.
            log.exception("the client's IO thread failed")
            self.broken = f"the client's IO thread failed ({exc!r}); connect a new pw.Client"
            self._fail_all(BrokenError(self.broken))

    def _serve(self) -> None:
        last_beat = time.monotonic()
        while not self._stopping.is_set():
            try:
                ready = dict(self._poller.poll(50))
            except zmq.ContextTerminated:
                # The context this client shares (an in-process cluster's) was closed
                # under it: nothing can be sent or received any more.
                self.broken = "the cluster this client shared a context with was closed"
                self._fail_all(BrokenError(self.broken))
                # The context's term() waits for its sockets: close the ones owned here.
                with self._ctl_lock:
                    self._ctl.close(0)
                    for sock in self._hosts.values():
                        sock.close(0)
                return
            # Deletions queue without ringing, so drain on every turn, not only when rung.
            self._drain_outbox()
            if self._ctl in ready:
                self._drain(self._ctl, None)
            # Checked on every turn: a send from a caller's thread may be what found the
            # connection closed, and a closed connection is never ready again.
            if self.broken is None and peer_gone(self._ctl):
                self.broken = (
                    f"the controller at {self._address} went away: its connection "
                    "closed (did the cluster's scheduler process end?). This client's "
                    "slices and arrays went with it; connect a new pw.Client to a "
                    "running cluster"
                )
                self._fail_all(BrokenError(self.broken))
            for sock, host in list(self._host_of_socket.items()):
                if sock in ready:
                    self._drain(sock, host)
            now = time.monotonic()
            if now - last_beat > self._heartbeat:
                self._safe_send(self._ctl, encode({"t": "heartbeat"}))
                last_beat = now
        # Best effort: tell the controller we are gone so it frees our slices at once.
        self._drain_outbox()
        self._safe_send(self._ctl, encode({"t": "bye"}))

    def _safe_send(self, sock: AnySocket, frames: list[Any]) -> None:
        try:
            sock.send_multipart(frames, copy=False)
        except zmq.ZMQError as exc:
            log.warning("client send failed: %s", exc)

    def delete_soon(self, handle: int, nbytes: int = 0, wake: bool = False) -> None:
        """Queue a deletion of an array of ``nbytes``; safe from any thread, including
        from ``__del__`` (where ``wake`` must stay False).

        It leaves on the IO thread's next turn, which ``wake`` starts now, after every
        launch submitted before it (those left from their callers already, or wait in the
        outbox, which that turn sends first): no launch can find its input already gone.
        Once the deletions queued add up to ``_EAGER_DELETE_BYTES``, they leave with the
        next message a caller sends itself.
        """
        self._deletes.append(handle)
        # Not atomic between threads: a count a little off only moves when they leave.
        self._delete_bytes += nbytes
        if wake:
            self._outbox.send(b"w", None)

    @property
    def deletes_waiting(self) -> bool:
        """Whether deletions are queued, not yet sent."""
        return bool(self._deletes)

    def deletes_now(self) -> None:
        """Send the deletions queued so far ahead of whatever a caller sends next (a
        put's note: the host waits for it before failing a put that does not fit)."""
        # Taken under the lock the IO thread drains under: deletions a drain in progress
        # took are sent before it lets go, so none can follow what the caller sends next.
        with self._ctl_lock:
            messages = self._delete_messages()
        for message in messages:
            self._to_controller(_BATCHED, [message], message)

    def _send_deletes(self) -> None:
        """Send the queued deletions now; the caller holds ``_ctl_lock``."""
        self._send_batch(self._delete_messages())

    def _delete_messages(self) -> list[Any]:
        """The queued deletions, taken off the queue, as packed delete messages."""
        self._delete_bytes = 0
        deletes: list[int] = []
        while self._deletes:
            deletes.append(self._deletes.popleft())
        return [
            pack({"t": "delete", "handles": deletes[at : at + _MAX_DELETE]})
            for at in range(0, len(deletes), _MAX_DELETE)
        ]

    def _drain_outbox(self) -> None:
        with self._ctl_lock:
            self._drain_outbox_locked()

    def _drain_outbox_locked(self) -> None:
        # Deletions may leave later than they were queued, never earlier (a launch queued
        # before a deletion may still read the array), so they are gathered and sent once,
        # after everything else this drain sends to the controller.
        batch: list[Any] = []
        deletes = self._delete_messages()
        for target, payload in self._outbox.drain():
            if target == _BATCHED:
                batch.append(payload)
                if len(batch) >= _MAX_BATCH:
                    self._send_batch(batch)
                    batch = []
            elif target == _CONTROLLER:
                if batch:
                    self._send_batch(batch)
                    batch = []
                self._safe_send(self._ctl, payload)
            elif target.startswith(_FORGET):
                self._close_host_socket(target[1:].decode())
            elif target.startswith(_HOST):
                address = target[1:].decode()
                try:
                    sock = self._host_socket(address)
                except BrokenError as exc:
                    # A host that died before this client reached it (its slice may
                    # have just been remapped there): what waits on it hears why, and
                    # this thread goes on serving everything else.
                    self.fail_host(address, exc)
                    continue
                self._safe_send(sock, payload)
        batch.extend(deletes)
        if batch:
            self._send_batch(batch)

    def _send_batch(self, batch: list[Any]) -> None:
        if not batch:
            return
        self._safe_send(self._ctl, [batch[0] if len(batch) == 1 else encode_batch(batch)])

    def _host_socket(self, address: str) -> DealerSocket:
        sock = self._hosts.get(address)
        if sock is None:
            sock = connect_dealer(self._ctx, address, peer="a host", tls=self._tls)
            self._hosts[address] = sock
            self._host_of_socket[sock] = address
            self._poller.register(sock, zmq.POLLIN)
        return sock

    def _close_host_socket(self, address: str) -> None:
        sock = self._hosts.pop(address, None)
        if sock is not None:
            del self._host_of_socket[sock]
            self._poller.unregister(sock)
            sock.close(0)

    def _drain(self, sock: AnySocket, host: str | None) -> None:
        for frames in receive(sock, 10_000):
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                log.warning("client dropped a bad message from %s: %s", host or "controller", exc)
                continue
            h = msg.header
            rid = h.get("rid")
            if isinstance(rid, int) and h["t"] in (
                "reply",
                "array",
                "failed",
                "error",
                "welcome",
                "refuse",
            ):
                with self._lock:
                    entry = self._futures.pop(rid, None)
                if entry is not None:
                    fut = entry[0]
                    if h["t"] == "failed":
                        fut.set_exception(RemoteError.from_dict(h.get("error") or {}))
                    elif h["t"] == "error":
                        fut.set_exception(ProtocolError(h.get("message", "")))
                    else:
                        fut.set_result((h, msg.buffers))
                continue
            if host is None and h["t"] in ("welcome", "refuse"):
                self._on_push(h)
                continue
            if host is None:
                try:
                    self._on_push(h)
                except Exception:
                    log.exception("client failed handling %r from the controller", h.get("t"))
            elif h["t"] in ("welcome", "refuse"):
                self._on_push(dict(h, host=host))
            else:
                log.warning("host %s says: %s", host, h.get("message", h))

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            futs = [f for f, _ in self._futures.values()]
            self._futures.clear()
        for f in futs:
            if not f.done():
                f.set_exception(error)
