"""The controller's thread: sockets around the resource manager and the gang scheduler.

One thread owns two ROUTER sockets (clients, hosts) and the state machines; other threads
(the Dask scheduler plugin, tests) reach it only through an :class:`~pathways_nb.wire.Outbox`.
Shutdown order: stop the loop, join the thread, close the sockets, then the context if we
made it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from pathways_nb._core import (
    BusyError,
    ClosedError,
    Config,
    ProtocolError,
    RemoteError,
    Versions,
    default_config,
    local_versions,
    new_secret,
    tenant_token,
    validate_weight,
)
from pathways_nb.controller._events import EventLog
from pathways_nb.controller._hosts import HostMessages
from pathways_nb.controller._records import Launch, Program
from pathways_nb.controller._requests import ClientRequests
from pathways_nb.controller._resources import ResourceManager
from pathways_nb.controller._scheduler import GangScheduler, SchedulerStatistics
from pathways_nb.controller._silence import LATE, Silences
from pathways_nb.controller._tenants import Tenant, Tenants
from pathways_nb.wire import (
    AnySocket,
    Outbox,
    Poller,
    bind_router,
    check,
    decode,
    departed,
    encode,
    encode_batch,
    pack,
    peer_id,
    receive,
)
from pathways_nb.wire._messages import error_header

log = logging.getLogger("pathways_nb.controller")


_CLIENT_TYPES = frozenset(
    {
        "hello",
        "heartbeat",
        "allocate",
        "release",
        "program",
        "launch",
        "transfer",
        "put_note",
        "delete",
        "batch",
        "status",
        "events",
        "cancel",
        "probe",
        "inject_fault",
        "bye",
    }
)
# What an observer (a read-only client) may ask.
_OBSERVER_TYPES = frozenset({"heartbeat", "status", "events", "bye"})
_BATCHABLE = frozenset({"launch", "transfer", "put_note", "delete", "heartbeat"})


@dataclasses.dataclass(frozen=True)
class ControllerStatistics:
    """A snapshot of the controller, safe to keep and print."""

    hosts: int
    live_hosts: int
    slices: int
    tenants: int
    programs: int
    live_handles: int
    launches_pending: int
    events: int
    scheduler: SchedulerStatistics


class Controller(ClientRequests, HostMessages):
    """Places virtual slices and gang-schedules programs onto hosts.

    ``Controller().start()`` binds two sockets (``client_address``, ``host_address``) and
    serves until :meth:`stop`. Both are idempotent.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        context: zmq.Context[Any] | None = None,
        bind_host: str = "127.0.0.1",
        inproc: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.config = config or default_config()
        # The server context of a cluster that uses TLS (see _core._tls): both endpoints
        # listen with it, so a client's and a host's messages, and the secret hosts get
        # when they register, never cross the network in the clear.
        self._tls = tls
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._bind_host = bind_host
        self._inproc = inproc
        self.versions: Versions = local_versions(with_export=False)
        # Given to hosts as they register; a client's token is its HMAC (see _core._keys).
        self.secret = new_secret()
        self.rm = ResourceManager()
        self.scheduler = GangScheduler(self.config.inflight_window)
        self.tenants = Tenants()
        self.events = EventLog(self.config.event_log_size)
        self._programs: dict[str, Program] = {}
        self._host_programs: dict[str, set[str]] = {}
        self._program_users: dict[str, set[int]] = {}
        self._host_ident: dict[str, bytes] = {}
        self._ident_host: dict[bytes, str] = {}
        self._silences = Silences()  # when each host last said something
        self._host_versions: dict[str, Versions] = {}
        self._launches: dict[int, Launch] = {}
        # Transfers in flight: lid -> (source host, destination host, destination handle).
        self._transfers: dict[int, tuple[str, str, int]] = {}
        self._where: dict[int, str] = {}
        self._slice_handles: dict[str, set[int]] = {}
        self._lost_handles: dict[int, str] = {}  # handle -> the host it was lost with
        self._probes: dict[int, tuple[bytes, int, str]] = {}  # rid -> client, its rid, host
        self._host_tenant_bytes: dict[str, dict[int, int]] = {}
        self._done_buf: dict[int, list[Any]] = {}
        self._done_due: float | None = None
        self._next_rid = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Set when the whole cluster shuts down: hosts going then are no loss to warn of.
        self._shutting_down = threading.Event()
        self._started = threading.Event()
        self._outbox: Outbox | None = None
        self.client_address = ""
        self._pending_stats: list[concurrent.futures.Future[ControllerStatistics]] = []
        self.host_address = ""

    # lifecycle ----------------------------------------------------------------------
    def start(self) -> Controller:
        if self._thread is not None:
            return self
        if self._inproc:
            from pathways_nb.wire import new_inproc_address

            caddr, haddr = new_inproc_address("ctl-clients"), new_inproc_address("ctl-hosts")
        else:
            caddr = haddr = f"tcp://{self._bind_host}:0"
        self._clients, self.client_address = bind_router(
            self._ctx, caddr, self.config.max_control_message, tls=self._tls
        )
        self._hosts, self.host_address = bind_router(
            self._ctx, haddr, self.config.max_control_message, tls=self._tls
        )
        self._outbox = Outbox()
        self._thread = threading.Thread(target=self._run, name="pathways-controller", daemon=True)
        self._thread.start()
        self._started.wait()
        return self

    def stop(self) -> None:
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        assert self._outbox is not None
        self._outbox.send(b"wake", None)
        self._thread.join()
        self._clients.close(0)
        self._hosts.close(0)
        self._outbox.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Controller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # thread-safe entry points -------------------------------------------------------
    def shutting_down(self) -> None:
        """Say the cluster is closing: hosts that go from now on are logged as gone,
        not warned of as lost."""
        self._shutting_down.set()

    def host_lost(self, host: str, reason: str = "the cluster reported it gone") -> None:
        """Tell the controller a host died (called from the Dask scheduler plugin)."""
        if self._outbox is not None:
            self._outbox.send(b"host_lost", (host, reason))

    def statistics(self, timeout: float = 10.0) -> ControllerStatistics:
        """A consistent snapshot, taken on the controller's own thread."""
        fut: concurrent.futures.Future[ControllerStatistics] = concurrent.futures.Future()
        self._pending_stats.append(fut)
        assert self._outbox is not None
        self._outbox.send(b"stats", None)
        return fut.result(timeout)

    # the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        assert self._outbox is not None
        poller = Poller()
        poller.register(self._clients, zmq.POLLIN)
        poller.register(self._hosts, zmq.POLLIN)
        poller.register(self._outbox.socket, zmq.POLLIN)
        departed(self._clients)  # from now on the router counts the clients that leave
        self._started.set()
        turned = time.monotonic()
        next_tick = turned + 0.5
        while not self._stopping.is_set():
            wake = next_tick if self._done_due is None else min(next_tick, self._done_due)
            timeout = max(0.0, wake - time.monotonic())
            ready = dict(poller.poll(math.ceil(timeout * 1000)))
            now = time.monotonic()
            late = now - turned - timeout  # this thread was kept from turning this long
            if late > LATE:
                self._silences.away(late)
                self.tenants.away(late)
            turned = now
            if self._hosts in ready:
                self._drain(self._hosts, self._on_host_frames)
            if self._clients in ready:
                self._drain(self._clients, self._on_client_frames)
                self._clients_departed()
            if self._outbox.socket in ready:
                for kind, payload in self._outbox.drain():
                    self._on_internal(kind, payload)
            self._flush()
            if self._done_due is not None and time.monotonic() >= self._done_due:
                self._flush_done()
            if time.monotonic() >= next_tick:
                self._tick()
                next_tick = time.monotonic() + 0.5

    def _clients_departed(self) -> None:
        """A client whose connection closed is gone (its process ended, or it closed its
        socket without saying goodbye): its slices are freed at once, not when its lease
        lapses. Clients over ZeroMQ (in-process) keep the lease alone."""
        for identity in departed(self._clients):
            t = self.tenants.by_identity.get(identity)
            if t is not None:
                log.warning("tenant %s (%s) disconnected; freeing its slices", t.tenant, t.name)
                self._drop_tenant(t, "its connection closed")

    def _drain(self, sock: AnySocket, handler: Any) -> None:
        for frames in receive(sock):
            try:
                handler(frames)
            except Exception:
                # A bug in one handler must not take the controller down; log it loudly.
                log.exception("controller failed handling a message")

    def _on_internal(self, kind: bytes, payload: Any) -> None:
        if kind == b"host_lost":
            host, reason = payload
            self._lose_host(host, reason)
        elif kind == b"stats":
            while self._pending_stats:
                self._pending_stats.pop().set_result(self._statistics())

    def _tick(self) -> None:
        for t in self.tenants.expired(self.config.lease_seconds):
            log.warning("tenant %s (%s) lease lapsed; freeing its slices", t.tenant, t.name)
            self._drop_tenant(t, "lease lapsed")
        timeout = self.config.host_timeout_seconds
        for host in self._silences.silent(time.monotonic(), timeout):
            self._lose_host(host, f"no word from it for {timeout:.0f} s")

    # sending ------------------------------------------------------------------------
    def _send_client(
        self, identity: bytes, header: dict[str, Any], bufs: Sequence[Any] = ()
    ) -> None:
        try:
            self._clients.send_multipart([identity, *encode(header, bufs)], copy=False)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            t = self.tenants.by_identity.get(identity)
            if t is not None:
                self._drop_tenant(t, "connection gone")

    def _send_host(self, host: str, header: dict[str, Any], bufs: Sequence[Any] = ()) -> bool:
        return self._send_host_frames(host, encode(header, bufs))

    def _send_host_frames(self, host: str, frames: Sequence[Any]) -> bool:
        ident = self._host_ident.get(host)
        if ident is None:
            return False
        try:
            self._hosts.send_multipart([ident, *frames], copy=False)
            return True
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self._lose_host(host, "its connection to the controller is gone")
            return False

    # clients ------------------------------------------------------------------------
    def _on_client_frames(self, frames: list[Any]) -> None:
        identity = peer_id(frames[0])
        header: Any = None
        try:
            msg = decode(frames[1:], self.config.max_control_message)
            header = msg.header
            kind = check(header, _CLIENT_TYPES)
        except ProtocolError as exc:
            # A request with a valid id hears why at once instead of timing out.
            rid = header.get("rid") if isinstance(header, dict) else None
            self._send_client(identity, error_header(str(exc), rid))
            return
        t = self.tenants.by_identity.get(identity)
        if kind == "hello":
            self._hello(identity, msg.header)
            return
        if t is None:
            self._send_client(
                identity, error_header("say hello before anything else", msg.header.get("rid"))
            )
            return
        t.last_seen = time.monotonic()
        if kind == "batch":
            # What the client submitted while we were busy, in one message: launches,
            # deletions, put notes.
            for sub in msg.header["msgs"]:
                try:
                    if not isinstance(sub, dict):
                        raise ProtocolError("batch entries must be maps")
                    sk = check(sub, _BATCHABLE)
                except ProtocolError as exc:
                    rid = sub.get("rid") if isinstance(sub, dict) else None
                    self._send_client(identity, error_header(str(exc), rid))
                    continue
                self._client_message(t, sk, sub, [])
            return
        self._client_message(t, kind, msg.header, msg.buffers)

    def _hello(self, identity: bytes, h: dict[str, Any]) -> None:
        rid = h.get("rid") if isinstance(h.get("rid"), int) else 0
        if h.get("role") != "client":
            self._send_client(
                identity,
                {
                    "t": "refuse",
                    "rid": rid,
                    "reason": f"this socket serves clients, not {h.get('role')!r}",
                },
            )
            return
        try:
            versions = Versions.from_dict(h["versions"])
        except ValueError as exc:
            self._send_client(identity, {"t": "refuse", "rid": rid, "reason": str(exc)})
            return
        why = versions.mismatch(self.versions, "client", "controller")
        for host, hv in self._host_versions.items():
            if why is None and self.rm.hosts[host].alive:
                why = versions.mismatch(hv, "client", f"host {host}")
        if why is not None:
            self._send_client(identity, {"t": "refuse", "rid": rid, "reason": why})
            return
        try:
            weight = validate_weight(h.get("weight", 1.0))
        except ValueError as exc:
            self._send_client(identity, {"t": "refuse", "rid": rid, "reason": str(exc)})
            return
        observer = h.get("observer") is True
        t = self.tenants.add(identity, str(h.get("name") or ""), weight, observer)
        if not observer:
            self.scheduler.set_weight(t.tenant, t.weight)
            self.events.add("tenant_join", t.tenant, detail=t.name)
        self._send_client(
            identity,
            {
                "t": "welcome",
                "rid": rid,
                "tenant": t.tenant,
                # An observer gets no token: hosts serve it nothing either.
                "token": "" if observer else tenant_token(self.secret, t.tenant),
                "window": self.config.inflight_window,
                "max_queued": self.config.max_queued_per_client,
                "remaps": self.config.remap_lost_slices,
            },
        )

    def _client_message(self, t: Tenant, kind: str, h: dict[str, Any], bufs: list[Any]) -> None:
        rid = h.get("rid")
        try:
            if t.observer and kind not in _OBSERVER_TYPES:
                raise ProtocolError(
                    f"{kind!r} is refused: this client observes only (it said hello as an "
                    "observer), which reads the status and the event log"
                )
            handler = getattr(self, f"_c_{kind}")
            handler(t, h, bufs)
        except (
            ProtocolError,
            ClosedError,
            BusyError,
            RemoteError,
            ValueError,
            KeyError,
            TypeError,
        ) as exc:
            if isinstance(rid, int):
                err = (
                    exc.to_dict()
                    if isinstance(exc, RemoteError)
                    else {"message": _message(exc), "kind": type(exc).__name__}
                )
                self._send_client(t.identity, {"t": "reply", "rid": rid, "error": err})
            elif kind in ("launch", "transfer"):
                self._fail_launch_now(t, h, exc)
            else:
                self._send_client(t.identity, error_header(f"{kind}: {exc}"))

    # dispatch -----------------------------------------------------------------------
    def _ensure_program(self, host: str, pid: str) -> None:
        have = self._host_programs.setdefault(host, set())
        if pid not in have:
            p = self._programs[pid]
            header = {
                "t": "program",
                "pid": pid,
                "name": p.name,
                "nin": p.nin,
                "nout": p.nout,
                "in_specs": p.in_specs,
            }
            if p.options:
                header["options"] = p.options
            if p.axis_types:
                header["axis_types"] = p.axis_types
            if p.kind != "xla":
                header["kind"] = p.kind
            if self._send_host(host, header, [p.blob]):
                have.add(pid)

    def _flush(self) -> None:
        """Send what the gang scheduler released, one batch message per host."""
        batches: dict[str, list[bytes]] = {}
        for w in self.scheduler.dispatch():
            if w.kind == "drop":
                host, handles = w.body
                batches.setdefault(host, []).append(pack({"t": "drop", "handles": handles}))
                continue
            if w.kind in ("send", "recv", "note"):
                host, header = w.body
                batches.setdefault(host, []).append(pack(header))
                continue
            s, h = w.body
            w.body = None
            if h["pid"] not in self._host_programs.get(s.host, ()):
                # The program's bytes travel on their own, after what is already batched.
                self._send_batch(s.host, batches.pop(s.host, []))
                self._ensure_program(s.host, h["pid"])
            run = {
                "t": "run",
                "lid": h["lid"],
                "slice": s.slice,
                "pid": h["pid"],
                "ins": h["ins"],
                "outs": h["outs"],
                "donate": h["donate"],
                "devices": s.devices,
                "mesh": [[k, v] for k, v in s.mesh.items()],
                "name": s.name,
            }
            if "check" in h:  # jax_debug_nans / jax_debug_infs in the client
                run["check"] = h["check"]
            batches.setdefault(s.host, []).append(pack(run))
        for host, frames in batches.items():
            self._send_batch(host, frames)

    def _send_batch(self, host: str, packed: list[bytes]) -> None:
        if packed:
            self._send_host_frames(host, [encode_batch(packed)])

    def _statistics(self) -> ControllerStatistics:
        return ControllerStatistics(
            hosts=len(self.rm.hosts),
            live_hosts=sum(1 for h in self.rm.hosts.values() if h.alive),
            slices=sum(1 for s in self.rm.slices.values() if s.state == "active"),
            tenants=len(self.tenants.by_id),
            programs=len(self._programs),
            live_handles=len(self._where),
            launches_pending=len(self._launches),
            events=len(self.events),
            scheduler=self.scheduler.statistics(),
        )


def _message(exc: Exception) -> str:
    """What an error says, without the quotes ``str`` puts around a KeyError's message."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc)
