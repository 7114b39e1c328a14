"""What the controller does for each client request: allocate, launch, delete, cancel, ...

A mixin of :class:`~pathways_nb.controller.Controller`, kept apart so each module reads in
one sitting; it runs on the controller's thread like the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pathways_nb._core import (
    PROGRAM_KINDS,
    CancelledError,
    ClosedError,
    Config,
    DataLossError,
    ProtocolError,
    RemoteError,
    ResourceExhaustedError,
    axis_type_names,
    compiler_options,
    decode_mesh,
    describe_foreign,
    foreign,
    program_id,
    validate_mesh_shape,
)
from pathways_nb.controller._events import EventLog
from pathways_nb.controller._records import Launch, Program
from pathways_nb.controller._resources import ResourceManager, SliceInfo
from pathways_nb.controller._scheduler import GangScheduler, Work
from pathways_nb.controller._tenants import Tenant, Tenants
from pathways_nb.wire._messages import error_header

# Events a status snapshot carries (the newest).
_STATUS_EVENTS = 20


class ClientRequests:
    """The ``_c_<type>`` handlers; the server dispatches each request to one by name."""

    config: Config
    rm: ResourceManager
    scheduler: GangScheduler
    tenants: Tenants
    events: EventLog
    _programs: dict[str, Program]
    _host_programs: dict[str, set[str]]
    _host_ident: dict[str, bytes]
    _launches: dict[int, Launch]
    _transfers: dict[int, tuple[str, str, int]]
    _where: dict[int, str]
    _slice_handles: dict[str, set[int]]
    _lost_handles: dict[int, str]
    _probes: dict[int, tuple[bytes, int, str]]
    _next_rid: int
    # pid -> tenants that sent or launched it; a program goes when the last has left.
    _program_users: dict[str, set[int]]
    # host -> tenant -> bytes of its arrays there, as the host's last heartbeat said.
    _host_tenant_bytes: dict[str, dict[int, int]]

    # Provided by the server, which owns the sockets.
    _send_client: Callable[..., None]
    _send_host: Callable[..., bool]
    _send_done: Callable[[dict[int, list[Any]]], None]
    _ensure_program: Callable[[str, str], None]
    _end_launch: Callable[[int], Launch | None]
    _remap_lost: Callable[[], None]

    def _reply(self, t: Tenant, rid: int, **body: Any) -> None:
        self._send_client(t.identity, {"t": "reply", "rid": rid, **body})

    def _c_heartbeat(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        pass

    def _c_bye(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        self._drop_tenant(t, "client closed")

    def _c_allocate(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        mesh = validate_mesh_shape(decode_mesh(h["mesh"]))
        types = axis_type_names(h.get("axis_types"))
        if types and len(types) != len(mesh):
            raise ValueError(
                f"axis_types gives one type per mesh axis ({len(mesh)}); got {types!r}"
            )
        s = self.rm.allocate(t.tenant, mesh, h.get("name"), self.config.tenant_max_devices, types)
        self._slice_handles[s.slice] = set()
        host = self.rm.hosts[s.host]
        self.events.add(
            "allocate",
            t.tenant,
            slice=s.slice,
            island=s.island,
            host=s.host,
            detail=f"{s.name} {mesh}",
        )
        self._reply(
            t,
            h["rid"],
            slice=s.to_dict(),
            data_address=host.data_address,
            platform=host.platform,
            bounded=host.bounded(self.config.tenant_store_bytes),
        )

    def _c_release(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        s = self.rm.get(h["slice"], t.tenant)
        if s.state == "active":
            self._release_slice(t, s)
            self.events.add("release", t.tenant, slice=s.slice, island=s.island, host=s.host)
            self._remap_lost()  # a lost slice may fit on the devices just freed
        else:
            self.rm.release(s.slice, t.tenant)  # releasing twice is a no-op
        self._reply(t, h["rid"])

    def _release_slice(self, t: Tenant, s: SliceInfo) -> None:
        """Free an active slice; its arrays are deleted on the host after queued work."""
        self.rm.release(s.slice, t.tenant)
        handles = self._slice_handles.pop(s.slice, set())
        for hd in handles:
            self._where.pop(hd, None)
        if handles:
            self.scheduler.submit(
                Work("drop", t.tenant, s.island, 0, body=(s.host, sorted(handles)))
            )

    def _c_program(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        if len(bufs) != 1:
            raise ProtocolError("a program message carries exactly one frame: the jax.export bytes")
        blob, key, kind = bytes(bufs[0]), h.get("key"), h.get("kind", "xla")
        if kind not in PROGRAM_KINDS:
            raise ProtocolError(
                f"program {h['pid']!r} ({h['name']}): kind must be one of {PROGRAM_KINDS}; "
                f"got {kind!r}"
            )
        try:
            options = compiler_options(h.get("options"))
            axis_types = axis_type_names(h.get("axis_types"))
        except TypeError as exc:
            raise ProtocolError(f"program {h['pid']!r} ({h['name']}): {exc}") from None
        if type(key) is not bytes or program_id(blob, key, options, axis_types, kind) != h["pid"]:
            raise ProtocolError(
                f"program {h['pid']!r} ({h['name']}): the id is not the digest of the bytes, "
                "key, compiler options, axis types and kind the message carries "
                "(pathways_nb._core.program_id)"
            )
        if h["pid"] not in self._programs:
            specs = h.get("in_specs")
            if not isinstance(specs, list) or len(specs) != h["nin"]:
                specs = [[] for _ in range(h["nin"])]
            self._programs[h["pid"]] = Program(
                h["name"], blob, h["nin"], h["nout"], specs, options, axis_types, kind
            )
        self._program_users.setdefault(h["pid"], set()).add(t.tenant)

    def _c_put_note(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        _check_own(t, (h["handle"],))
        s = self.rm.active(h["slice"], t.tenant)
        self._track(h["handle"], s.slice)
        # Passed on in the island's order, behind the deletions sent before the put: a
        # put that did not fit waits for it on the host (see worker/_puts.py).
        note = {"t": "noted", "handle": h["handle"]}
        self.scheduler.submit(Work("note", t.tenant, s.island, 0, body=(s.host, note)))

    def _track(self, handle: int, sid: str) -> None:
        self._where[handle] = sid
        self._slice_handles.setdefault(sid, set()).add(handle)

    def _untrack(self, handle: int) -> str | None:
        sid = self._where.pop(handle, None)
        if sid is not None:
            hs = self._slice_handles.get(sid)
            if hs is not None:
                hs.discard(handle)
        return sid

    def _c_delete(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        by_slice: dict[str, list[int]] = {}
        refused: list[object] = []
        for hd in h["handles"]:
            if foreign((hd,), t.tenant) is not None:
                refused.append(hd)
                continue
            sid = self._untrack(hd)
            if sid is not None:
                by_slice.setdefault(sid, []).append(hd)
        for sid, handles in by_slice.items():
            s = self.rm.slices.get(sid)
            if s is not None and s.state == "active":
                self.scheduler.submit(Work("drop", t.tenant, s.island, 0, body=(s.host, handles)))
        if refused:
            why = describe_foreign("array", refused[0], t.tenant)
            self._send_client(
                t.identity, error_header(f"delete: {len(refused)} handle(s) not deleted: {why}")
            )

    def _check_room(self, t: Tenant) -> None:
        """Refuse a launch or transfer past what the controller holds for one client.

        ``pw.Client`` blocks at ``max_queued_per_client`` launches not yet done, so it
        never comes near twice that; a client speaking the protocol itself could queue
        without end and take the controller's memory, and so everyone's cluster, with it.
        """
        limit = 2 * self.config.max_queued_per_client
        if t.pending >= limit:
            raise ResourceExhaustedError(
                f"this client has {t.pending} launches and transfers queued or running, the "
                f"most the controller holds for one client ({limit}: twice "
                "PATHWAYS_MAX_QUEUED_PER_CLIENT, within which pw.Client keeps by blocking). "
                "Wait for results before submitting more"
            )

    def _c_launch(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        self._check_room(t)
        ins, outs = h["ins"], h["outs"]
        # Its inputs need no check of their own: each must live on this tenant's slice,
        # where only this tenant's own launches, puts and transfers put arrays.
        _check_own(t, (h["lid"], *outs))
        s = self.rm.active(h["slice"], t.tenant)
        prog = self._programs.get(h["pid"])
        if prog is None:
            raise ProtocolError(f"program {h['pid']} was never sent to the controller")
        self._program_users[h["pid"]].add(t.tenant)
        if len(ins) != prog.nin or len(outs) != prog.nout:
            raise ProtocolError(
                f"program {prog.name} takes {prog.nin} inputs and makes {prog.nout} outputs; "
                f"the launch gave {len(ins)} and {len(outs)}"
            )
        for hd in ins:
            where = self._where.get(hd)
            if where != s.slice:
                if where is None and hd in self._lost_handles:
                    raise DataLossError(
                        f"input {hd:#x} of program {prog.name} was lost with host "
                        f"{self._lost_handles[hd]}; put its value again",
                        host=self._lost_handles[hd],
                    )
                raise ClosedError(
                    f"input {hd:#x} of program {prog.name} is "
                    + ("not a live array" if where is None else f"on slice {where}, not {s.slice}")
                )
        check = h.get("check")
        if check is not None and (type(check) is not int or not 0 <= check <= 3):
            raise ProtocolError(
                f"a launch's check is 1 (NaN), 2 (inf) or 3 (both), or absent; got {check!r}"
            )
        for i in h["donate"]:
            self._untrack(ins[i])
        for hd in outs:
            self._track(hd, s.slice)
        lid = h["lid"]
        self._launches[lid] = Launch(
            t.tenant, h["pid"], prog.name, s.slice, s.island, s.host, list(outs), time.time()
        )
        t.launches += 1
        t.pending += 1
        self.events.add("launch", t.tenant, lid, prog.name, s.slice, s.island, s.host)
        self.scheduler.submit(Work("run", t.tenant, s.island, lid, cost_key=h["pid"], body=(s, h)))

    def _c_transfer(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        """Move an array between slices: a send on the source island's queue, a receive
        on the destination's; the bytes go host to host."""
        self._check_room(t)
        _check_own(t, (h["lid"], h["src"], h["dst"]))
        dst = self.rm.active(h["slice"], t.tenant)
        # Tracked first: if the move fails, consumers of the copy fail with its cause.
        self._track(h["dst"], dst.slice)
        src_sid = self._where.get(h["src"])
        if src_sid is None:
            lost_with = self._lost_handles.get(h["src"])
            if lost_with is not None:
                raise DataLossError(
                    f"array {h['src']:#x} was lost with host {lost_with}; it cannot be moved",
                    host=lost_with,
                )
            raise ClosedError(f"array {h['src']:#x} is not a live array; it cannot be moved")
        src = self.rm.active(src_sid, t.tenant)
        dst_host = self.rm.hosts[dst.host]
        lid = h["lid"]
        self._launches[lid] = Launch(
            t.tenant, "", "transfer", dst.slice, dst.island, dst.host, [h["dst"]], time.time()
        )
        self._transfers[lid] = (src.host, dst.host, h["dst"])
        t.launches += 1
        t.pending += 1
        self.events.add(
            "launch",
            t.tenant,
            lid,
            "transfer",
            dst.slice,
            dst.island,
            dst.host,
            detail=f"{src.host}→{dst.host}",
        )
        send = {
            "t": "send",
            "lid": lid,
            "src": h["src"],
            "dst": h["dst"],
            "address": dst_host.data_address,
            "shape": h["shape"],
            "spec": h["spec"],
            "devices": dst.devices,
            "mesh": [[k, v] for k, v in dst.mesh.items()],
        }
        for key in ("hlo_sharding", "shard"):
            # Plain JAX's layout and one device's buffer, through the IFRT proxy: the
            # source host checks them.
            if key in h:
                send[key] = h[key]
        recv = {"t": "recv", "dst": h["dst"], "source": src.host}
        self.scheduler.submit(Work("send", t.tenant, src.island, 0, body=(src.host, send)))
        self.scheduler.submit(Work("recv", t.tenant, dst.island, 0, body=(dst.host, recv)))

    def _fail_launch_now(self, t: Tenant, h: dict[str, Any], exc: Exception) -> None:
        lid = h.get("lid")
        prog = self._programs.get(str(h.get("pid")))
        name = prog.name if prog is not None else str(h.get("pid", "transfer"))
        if isinstance(exc, RemoteError):
            err = exc
            err.program = err.program or name
        else:
            err = RemoteError(str(exc), kind="invalid", program=name, slice=str(h.get("slice", "")))
        self._send_done({t.tenant: [[lid, err.to_dict()]]})
        # Only its own arrays hold the error: a launch naming another tenant's fails alone.
        outs = [o for o in h.get("outs", [h.get("dst")]) if foreign((o,), t.tenant) is None]
        s = self.rm.slices.get(str(h.get("slice")))
        if s is not None and outs:
            self._send_host(s.host, {"t": "fail_outputs", "handles": outs, "error": err.to_dict()})

    def _c_cancel(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        n = self._cancel_queued(t, "cancelled by the client (interrupt)")
        self._reply(t, h["rid"], cancelled=n)

    def _cancel_queued(self, t: Tenant, why: str) -> int:
        dropped = self.scheduler.cancel(t.tenant)
        done = []
        for w in dropped:
            rec = self._end_launch(w.lid)
            if rec is None:
                continue
            err = CancelledError(why)
            rerr = RemoteError(
                str(err), kind="cancelled", program=rec.name, slice=rec.slice, host=rec.host
            )
            done.append([w.lid, rerr.to_dict()])
            self._send_host(
                rec.host, {"t": "fail_outputs", "handles": rec.outs, "error": rerr.to_dict()}
            )
            self.events.add("cancel", t.tenant, w.lid, rec.name, rec.slice, rec.island, rec.host)
        if done:
            self._send_done({t.tenant: done})
        # Launches already sent to hosts but not started yet are dropped there; they come
        # back as failed acknowledgements, which also frees their window slots.
        hosts = {s.host for s in self.rm.slices.values() if s.tenant == t.tenant}
        for host in hosts & set(self._host_ident):
            self._send_host(host, {"t": "cancel_runs", "tenant": t.tenant, "message": why})
        return len(done)

    def _c_status(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        snap = self.rm.snapshot()
        for host in snap["hosts"]:
            # Every tenant's arrays on the host, as of its last heartbeat.
            host["store_bytes"] = sum(self._host_tenant_bytes.get(host["host"], {}).values())
        stats = self.scheduler.statistics()
        held = self.rm.held_by_tenant()
        snap["tenants"] = [
            {
                "tenant": x.tenant,
                "name": x.name,
                "weight": x.weight,
                "launches": x.launches,
                "pending": x.pending,
                "device_seconds": x.device_seconds,
                "devices": held.get(x.tenant, 0),
                "store_bytes": sum(b.get(x.tenant, 0) for b in self._host_tenant_bytes.values()),
            }
            for x in self.tenants.by_id.values()
            if not x.observer
        ]
        snap["quotas"] = {
            "max_devices": self.config.tenant_max_devices,
            "store_bytes": self.config.tenant_store_bytes,
        }
        snap["queued"] = stats.queued
        snap["inflight"] = stats.inflight
        snap["events_total"] = self.events.total
        # The newest few of the client's own events, so a status snapshot shows activity
        # (an observer, which runs nothing, sees every tenant's).
        snap["events"], _ = self.events.after(
            self.events.total - _STATUS_EVENTS, None if t.observer else t.tenant
        )
        snap["window"] = self.config.inflight_window
        snap["you"] = t.tenant
        self._reply(t, h["rid"], status=snap)

    def _c_events(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        tenant = None if h.get("all") else t.tenant
        after = h.get("after")
        if isinstance(after, int) and not isinstance(after, bool):
            events, nxt = self.events.after(after, tenant, since=float(h.get("since", 0.0)))
            self._reply(t, h["rid"], events=events, next=nxt)
        else:
            self._reply(t, h["rid"], events=self.events.since(float(h["since"]), tenant))

    def _c_probe(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        s = self.rm.active(h["slice"], t.tenant)
        prog = self._programs.get(h["pid"])
        if prog is None:
            raise ProtocolError(f"program {h['pid']} was never sent to the controller")
        donate = h.get("donate", [])
        if not isinstance(donate, list) or not all(
            type(i) is int and 0 <= i < prog.nin for i in donate
        ):
            raise ProtocolError(
                f"a probe's donate lists input positions of {prog.name} (0..{prog.nin - 1}); "
                f"got {donate!r}"
            )
        self._ensure_program(s.host, h["pid"])
        self._next_rid += 1
        rid = self._next_rid
        self._probes[rid] = (t.identity, h["rid"], s.host)
        sent = self._send_host(
            s.host,
            {
                "t": "host_probe",
                "rid": rid,
                "pid": h["pid"],
                "devices": s.devices,
                "mesh": [[k, v] for k, v in s.mesh.items()],
                "donate": donate,
                "analysis": bool(h.get("analysis")),
            },
        )
        # Sending the program or the probe can find the host's connection gone, which
        # loses the host at once; nothing would ever answer a probe left waiting for it.
        if not sent and self._probes.pop(rid, None) is not None:
            raise DataLossError(
                f"host {s.host} was lost before it could compile {h['pid']}", host=s.host
            )

    def _c_inject_fault(self, t: Tenant, h: dict[str, Any], bufs: list[Any]) -> None:
        host = h["host"]
        if host in self.rm.slices:
            host = self.rm.get(host, t.tenant).host
        if host not in self._host_ident:
            raise ValueError(
                f"inject_fault takes a VirtualSlice of this client or a live host's name; "
                f"got {host!r} (live hosts: {sorted(self._host_ident)})"
            )
        if h["kind"] == "crash":
            others = sorted(
                s.name
                for s in self.rm.slices.values()
                if s.host == host and s.tenant != t.tenant and s.state == "active"
            )
            if others:
                raise ValueError(
                    f"a crash fault ends host {host}, and with it other tenants' slices "
                    f"{others}: inject it on a host only this client's slices use"
                )
        self._send_host(
            host, {"t": "fault", "match": h["match"], "kind": h["kind"], "tenant": t.tenant}
        )
        self._reply(t, h["rid"], host=host)

    def _drop_tenant(self, t: Tenant, why: str) -> None:
        if t.tenant not in self.tenants.by_id:
            return
        self._cancel_queued(t, f"the client went away ({why})")
        for s in list(self.rm.slices.values()):
            if s.tenant == t.tenant and s.state == "active":
                self._release_slice(t, s)
        self.rm.forget_tenant(t.tenant)
        if not t.observer:
            self.events.add("tenant_leave", t.tenant, detail=why)
        self.tenants.remove(t.tenant)
        self.scheduler.forget_tenant(t.tenant)
        self._forget_programs(t.tenant)
        self._remap_lost()

    def _forget_programs(self, tenant: int) -> None:
        """The tenant left: the programs no other tenant sent or launched go, here and on
        the hosts (their compiled executables with them). A cluster that outlives many
        notebooks would otherwise keep every program each of them ever ran."""
        gone = []
        for pid, users in list(self._program_users.items()):
            users.discard(tenant)
            if not users:
                del self._program_users[pid]
                self._programs.pop(pid, None)
                gone.append(pid)
        if not gone:
            return
        for host, have in self._host_programs.items():
            pids = [p for p in gone if p in have]
            if pids:
                have.difference_update(pids)
                # Behind the tenant's own work already sent there (cancelled or not).
                self._send_host(host, {"t": "forget_programs", "pids": pids})


def _check_own(t: Tenant, ids: tuple[Any, ...]) -> None:
    """Refuse a request naming an array or launch id that this tenant did not make."""
    bad = foreign(ids, t.tenant)
    if bad is not None:
        raise ProtocolError(describe_foreign("id", bad, t.tenant))
