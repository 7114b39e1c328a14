"""What the controller does with its hosts' messages: registration, acknowledgements,
parked launches, compile replies, and what losing a host undoes.

A mixin of :class:`~pathways_nb.controller.Controller`, kept apart so each module reads in
one sitting; it runs on the controller's thread like the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from pathways_nb._core import Config, DataLossError, ProtocolError, Versions
from pathways_nb.controller._events import EventLog
from pathways_nb.controller._records import Launch
from pathways_nb.controller._resources import HostInfo, ResourceManager, SliceInfo
from pathways_nb.controller._scheduler import GangScheduler
from pathways_nb.controller._silence import Silences
from pathways_nb.controller._tenants import Tenants
from pathways_nb.wire import RouterSocket, check, decode, encode, peer_id
from pathways_nb.wire._messages import error_header

log = logging.getLogger("pathways_nb.controller")

_HOST_TYPES = frozenset({"register", "acks", "parked", "host_reply", "heartbeat"})
# Completion notices to a client wait at most this long, or until this many are buffered.
_DONE_DELAY = 0.02
_DONE_BATCH = 256
# Handles of arrays lost with their hosts, remembered (the newest) so that a program
# given one hears it was lost rather than that it never existed.
_LOST_HANDLES = 100_000


class HostMessages:
    """Handlers for the host socket; the server routes each host message here."""

    config: Config
    versions: Versions
    secret: bytes
    rm: ResourceManager
    scheduler: GangScheduler
    tenants: Tenants
    events: EventLog
    _hosts: RouterSocket
    _host_programs: dict[str, set[str]]
    _host_ident: dict[str, bytes]
    _ident_host: dict[bytes, str]
    _silences: Silences
    _host_versions: dict[str, Versions]
    _launches: dict[int, Launch]
    _transfers: dict[int, tuple[str, str, int]]
    _where: dict[int, str]
    _slice_handles: dict[str, set[int]]
    _lost_handles: dict[int, str]
    _probes: dict[int, tuple[bytes, int, str]]
    _host_tenant_bytes: dict[str, dict[int, int]]
    # tenant -> [lid, error] notices not yet sent; when the oldest must go (monotonic).
    _done_buf: dict[int, list[Any]]
    _done_due: float | None
    _shutting_down: threading.Event

    # Provided by the server, which owns the sockets.
    _send_client: Callable[..., None]
    _send_host: Callable[..., bool]

    def _on_host_frames(self, frames: list[Any]) -> None:
        identity = peer_id(frames[0])
        try:
            msg = decode(frames[1:], self.config.max_control_message)
            kind = check(msg.header, _HOST_TYPES)
        except ProtocolError as exc:
            self._reply_peer(identity, error_header(str(exc)))
            return
        h = msg.header
        host = self._ident_host.get(identity)
        if host is not None:
            self._silences.heard(host, time.monotonic())
        if kind == "register":
            self._register_host(identity, h)
            return
        if host is None:
            self._reply_peer(identity, error_header("register before sending anything else"))
            return
        if kind == "acks":
            self._on_acks(host, h["items"])
        elif kind == "heartbeat":
            self._on_heartbeat(host, h)
        elif kind == "parked":
            # Launches waiting on the host for a transfer hold no window slot.
            for lid in h["lids"]:
                if isinstance(lid, int):
                    self.scheduler.release(lid)
        elif kind == "host_reply":
            target = self._probes.pop(h["rid"], None)
            if target is not None:
                ident, crid, _ = target
                reply = dict(h)
                reply["t"], reply["rid"] = "reply", crid
                self._send_client(ident, reply)

    def _reply_peer(self, identity: bytes, header: dict[str, Any]) -> bool:
        """Answer whoever sent a message on the host socket, registered or not. A peer
        can close between sending and hearing back (a host lost or closing with the
        cluster still has messages in flight); that peer is past answering, so it is
        ``False`` here, never an error in the controller's loop."""
        try:
            self._hosts.send_multipart([identity, *encode(header)])
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return False
        return True

    def _register_host(self, identity: bytes, h: dict[str, Any]) -> None:
        try:
            versions = Versions.from_dict(h.get("versions"))
        except ValueError as exc:
            self._reply_peer(identity, {"t": "refuse", "reason": str(exc)})
            return
        why = self.versions.mismatch(versions, "controller", f"host {h['host']}")
        if why is not None:
            self._reply_peer(identity, {"t": "refuse", "reason": why})
            return
        host = h["host"]
        if host in self._host_ident and self.rm.hosts[host].alive:
            self._lose_host(host, "it registered again (restarted)")
        info = HostInfo(
            host=host,
            island=h["island"],
            devices=[int(d) for d in h["devices"]],
            data_address=h["data_address"],
            process=h["process"],
            platform=h["platform"],
            store_limit=h["store_limit"] if type(h.get("store_limit")) is int else 0,
        )
        self.rm.add_host(info)
        self.scheduler.add_island(info.island, info.process)
        self._host_ident[host] = identity
        self._ident_host[identity] = host
        self._silences.heard(host, time.monotonic())
        self._host_versions[host] = versions
        self._host_programs[host] = set()
        self.events.add(
            "host_join", island=info.island, host=host, detail=f"{len(info.devices)} devices"
        )
        welcome = {
            "t": "welcome",
            "secret": self.secret,
            "tenant_store_bytes": self.config.tenant_store_bytes,
        }
        if not self._reply_peer(identity, welcome):
            self._lose_host(host, "its connection closed as it registered")
            return
        self._remap_lost()

    def _on_heartbeat(self, host: str, h: dict[str, Any]) -> None:
        """A host's beat carries the bytes each tenant's arrays take there, as
        ``[[tenant, bytes], ...]``, for status snapshots; a malformed list is ignored."""
        pairs = h.get("tenant_bytes")
        if not isinstance(pairs, list):
            return
        seen = {}
        for pair in pairs:
            if (
                isinstance(pair, list)
                and len(pair) == 2
                and all(type(v) is int and v >= 0 for v in pair)
            ):
                seen[pair[0]] = pair[1]
        self._host_tenant_bytes[host] = seen

    def _remap_lost(self) -> None:
        """Move lost slices onto free devices, where there are any now: after a host
        joins, after one is lost (a spare island may have room) and after a release."""
        if self.config.remap_lost_slices:
            for s in self.rm.remap_lost():
                self._remapped(s)

    def _remapped(self, s: SliceInfo) -> None:
        """A lost slice is active again on a live host's devices: its client hears where."""
        self._slice_handles[s.slice] = set()
        host = self.rm.hosts[s.host]
        self.events.add(
            "remap",
            s.tenant,
            slice=s.slice,
            island=s.island,
            host=s.host,
            detail=f"{s.name} onto devices {s.devices}",
        )
        log.warning("slice %s remapped onto host %s", s.name, s.host)
        t = self.tenants.by_id.get(s.tenant)
        if t is not None:
            self._send_client(
                t.identity,
                {
                    "t": "remapped",
                    "slice": s.to_dict(),
                    "data_address": host.data_address,
                    "platform": host.platform,
                    "bounded": host.bounded(self.config.tenant_store_bytes),
                },
            )

    def _on_acks(self, host: str, items: list[Any]) -> None:
        by_tenant: dict[int, list[Any]] = {}
        for item in items:
            lid, t0, t1, err = item[:4]
            rec = self._launches.pop(lid, None)
            if rec is None:
                continue
            detail = err.get("kind", "") if err else ""
            if rec.name == "transfer":
                # A transfer's destination reports it: from the source's first byte to
                # the array assembled here.
                self._transfers.pop(lid, None)
                info = item[4] if len(item) > 4 and isinstance(item[4], dict) else {}
                detail = f"{info.get('source', '?')}→{host} {info.get('bytes', 0)} B" + (
                    f" {detail}" if detail else ""
                )
            else:
                self.scheduler.complete(lid, max(0.0, t1 - t0))
            self.events.add("start", rec.tenant, lid, rec.name, rec.slice, rec.island, host, at=t0)
            self.events.add(
                "error" if err else "end",
                rec.tenant,
                lid,
                rec.name,
                rec.slice,
                rec.island,
                host,
                detail=detail,
                at=t1,
            )
            t = self.tenants.by_id.get(rec.tenant)
            if t is not None:
                t.device_seconds += max(0.0, t1 - t0)
                t.pending -= 1
            by_tenant.setdefault(rec.tenant, []).append([lid, err])
        self._send_done(by_tenant)

    def _send_done(self, by_tenant: dict[int, list[Any]]) -> None:
        """Tell clients which of their launches finished.

        Failures go at once; successes wait up to ``_DONE_DELAY`` for company. A client
        learns that a launch finished from the fetch or wait that needed it, so these
        notices only feed ``is_ready()``, ``pending()`` and back-pressure: a message per
        completion would cost every round trip a wake-up of the client's IO thread.
        """
        for tenant, done in by_tenant.items():
            buf = self._done_buf.setdefault(tenant, [])
            buf.extend(done)
            if len(buf) >= _DONE_BATCH or any(err for _, err in done):
                self._flush_done(tenant)
            elif self._done_due is None:
                self._done_due = time.monotonic() + _DONE_DELAY

    def _flush_done(self, tenant: int | None = None) -> None:
        """Send the buffered notices of ``tenant`` (of every tenant when None)."""
        tenants = list(self._done_buf) if tenant is None else [tenant]
        for tid in tenants:
            done = self._done_buf.pop(tid, None)
            t = self.tenants.by_id.get(tid)
            if done and t is not None:
                self._send_client(t.identity, {"t": "done", "items": done})
        if not self._done_buf:
            self._done_due = None

    def _end_launch(self, lid: int) -> Launch | None:
        """Stop tracking a launch that will not be acknowledged (failed or cancelled here);
        its tenant has one launch fewer pending. None if it was not tracked."""
        rec = self._launches.pop(lid, None)
        if rec is not None:
            t = self.tenants.by_id.get(rec.tenant)
            if t is not None:
                t.pending -= 1
        return rec

    def _lose_host(self, host: str, reason: str) -> None:
        info = self.rm.hosts.get(host)
        if info is None or not info.alive:
            return
        lost = self.rm.lose_host(host)
        self._silences.forget(host)
        self._host_tenant_bytes.pop(host, None)
        ident = self._host_ident.pop(host, None)
        if ident is not None:
            self._ident_host.pop(ident, None)
        self.events.add("host_lost", island=info.island, host=host, detail=reason)
        if self._shutting_down.is_set():
            log.info("host %s gone as the cluster closes: %s", host, reason)
        else:
            log.warning("host %s lost: %s", host, reason)
        # Clients hear that the slices are lost before any launch fails with them, so
        # code that catches the failure finds the slice lost (and new work waits for it).
        per_tenant: dict[int, list[str]] = {}
        for s in lost:
            per_tenant.setdefault(s.tenant, []).append(s.slice)
        for tenant, sids in per_tenant.items():
            t = self.tenants.by_id.get(tenant)
            if t is not None:
                self._send_client(t.identity, {"t": "host_lost", "host": host, "slices": sids})
        err = DataLossError(
            f"host {host} was lost ({reason}) before this program finished",
            host=host,
        )
        failed = self.scheduler.fail_island(info.island)
        by_tenant: dict[int, list[Any]] = {}
        for w in failed:
            rec = self._end_launch(w.lid)
            if rec is not None:
                d = err.to_dict() | {"program": rec.name, "slice": rec.slice}
                by_tenant.setdefault(rec.tenant, []).append([w.lid, d])
        # Transfers from or to that host will not complete: the destination learns why.
        for lid, (src, dst, handle) in list(self._transfers.items()):
            if host not in (src, dst):
                continue
            del self._transfers[lid]
            rec = self._end_launch(lid)
            if rec is None:
                continue
            d = err.to_dict() | {"program": "transfer", "slice": rec.slice}
            by_tenant.setdefault(rec.tenant, []).append([lid, d])
            if dst != host:
                self._send_host(dst, {"t": "fail_outputs", "handles": [handle], "error": d})
        self._send_done(by_tenant)
        # A compile that host was doing for a client will never answer: say why now.
        for rid, (ident, crid, where) in list(self._probes.items()):
            if where == host:
                del self._probes[rid]
                self._send_client(ident, {"t": "reply", "rid": crid, "error": err.to_dict()})
        for s in lost:
            for hd in self._slice_handles.pop(s.slice, set()):
                self._where.pop(hd, None)
                self._lost_handles[hd] = host
        while len(self._lost_handles) > _LOST_HANDLES:
            self._lost_handles.pop(next(iter(self._lost_handles)))
        self._remap_lost()
