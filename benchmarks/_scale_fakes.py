"""The fakes of ``benchmarks.scale``: hosts and raw tenants in one spawned process.

One thread owns every socket. A fake host registers as the real one does and
acknowledges every ``run`` at once; a tenant speaks what ``pw.Client`` sends, within the
controller's back-pressure. ``load_process`` is the process's body, driven over a pipe.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import zmq

from pathways_nb._core import HandleAllocator, local_versions, program_id
from pathways_nb.wire import DealerSocket, Poller, connect_dealer, encode_batch, pack, receive

DEVICES_PER_HOST = 8
ROUNDS_PER_BATCH = 16
PUT_NOTES_PER_BATCH = 512  # the real client's largest batch
FAKE_DEVICE_SECONDS = 1e-4
BLOB = b"not parsed"  # the controller keeps a program's bytes unparsed
KEY = b"add_one"
PID = program_id(BLOB, KEY)
TIMEOUT = 120.0  # seconds any one step may take before the benchmark gives up


def _unpack(frame: Any) -> dict[str, Any]:
    raw = frame.buffer if hasattr(frame, "buffer") else frame
    out: dict[str, Any] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return out


_Handler = Callable[[DealerSocket, list[Any]], None]


@dataclasses.dataclass
class _Tenant:
    sock: DealerSocket
    tenant: int = 0
    max_queued: int = 0
    ids: HandleAllocator | None = None  # once the controller named the tenant
    slices: list[str] = dataclasses.field(default_factory=list)
    heads: dict[str, int] = dataclasses.field(default_factory=dict)
    batches: collections.deque[tuple[bytes, int]] = dataclasses.field(
        default_factory=collections.deque
    )
    outstanding: int = 0
    done: int = 0
    replies: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    next_rid: int = 0

    def next_id(self) -> int:
        """A fresh handle or launch id, made as the real client makes them."""
        if self.ids is None:
            raise RuntimeError("the controller has not welcomed this tenant yet")
        return self.ids.next()


class _Load:
    """Fake hosts and raw tenants for one point of the sweep, all on this one thread."""

    def __init__(self, ctx: zmq.Context[Any], client_address: str, host_address: str) -> None:
        self.versions = local_versions(with_export=False).to_dict()
        self.ctx = ctx
        self.poller = Poller()
        self.hosts: list[DealerSocket] = []
        self.tenants: list[_Tenant] = []
        self.handlers: dict[DealerSocket, _Handler] = {}
        self.of_sock: dict[DealerSocket, _Tenant] = {}
        self.welcomed = 0
        self.nout: dict[str, int] = {}
        self.next_beat = time.monotonic() + 1.0
        self._client_address = client_address
        self._host_address = host_address

    def _add(self, sock: DealerSocket, handler: _Handler) -> None:
        self.poller.register(sock, zmq.POLLIN)
        self.handlers[sock] = handler

    # setup --------------------------------------------------------------------------
    def setup(self, hosts: int, tenants: int, live_arrays: int) -> dict[str, Any]:
        for i in range(hosts):
            sock = connect_dealer(self.ctx, self._host_address)
            self.hosts.append(sock)
            self._add(sock, self._on_host)
            register = {
                "t": "register",
                "host": f"fake{i}",
                "island": f"island{i}",
                "devices": list(range(DEVICES_PER_HOST)),
                "data_address": "tcp://127.0.0.1:9",  # never used: no client puts here
                "versions": self.versions,
                "process": f"fake-process-{i}",
                "platform": "cpu",
            }
            sock.send_multipart([msgpack.packb(register, use_bin_type=True)])
        self.serve(lambda: self.welcomed == hosts)
        for i in range(tenants):
            t = _Tenant(connect_dealer(self.ctx, self._client_address))
            self.tenants.append(t)
            self.of_sock[t.sock] = t
            self._add(t.sock, self._on_tenant)
            hello = {
                "t": "hello",
                "role": "client",
                "rid": 0,
                "versions": self.versions,
                "name": f"tenant{i}",
            }
            t.sock.send_multipart([msgpack.packb(hello, use_bin_type=True)])
        self.serve(lambda: all(t.tenant for t in self.tenants))
        # One 8-device slice per island: the resource manager spreads slices, so each
        # lands on a host of its own.
        used = set()
        for j in range(hosts):
            t = self.tenants[j % tenants]
            reply = self.request(
                t, {"t": "allocate", "mesh": [["d", DEVICES_PER_HOST]], "name": None}
            )
            t.slices.append(reply["slice"]["slice"])
            used.add(reply["slice"]["host"])
        if len(used) != hosts:
            raise RuntimeError(f"{hosts} slices landed on {len(used)} hosts, not one each")
        # The controller keeps a program's bytes unparsed and forwards them to hosts.
        program = {
            "t": "program",
            "pid": PID,
            "key": KEY,
            "name": "add_one",
            "nin": 1,
            "nout": 1,
            "in_specs": [[]],
        }
        for t in self.tenants:
            t.sock.send_multipart([msgpack.packb(program, use_bin_type=True), BLOB])
        # The chain heads, then the idle live arrays, spread over every slice.
        every = [(t, sid) for t in self.tenants for sid in t.slices]
        notes: dict[int, list[bytes]] = collections.defaultdict(list)
        for t, sid in every:
            t.heads[sid] = t.next_id()
            notes[t.tenant].append(_put_note(t.heads[sid], sid))
        for i in range(live_arrays):
            t, sid = every[i % len(every)]
            notes[t.tenant].append(_put_note(t.next_id(), sid))
        for t in self.tenants:
            mine = notes[t.tenant]
            for k in range(0, len(mine), PUT_NOTES_PER_BATCH):
                t.sock.send_multipart([encode_batch(mine[k : k + PUT_NOTES_PER_BATCH])])
        # A reply comes after everything the tenant sent before it: the notes are in.
        for t in self.tenants:
            self.request(t, {"t": "status"})
        return {"slices": sum(len(t.slices) for t in self.tenants)}

    def request(self, t: _Tenant, header: dict[str, Any]) -> dict[str, Any]:
        t.next_rid += 1
        rid = t.next_rid
        t.sock.send_multipart([msgpack.packb({**header, "rid": rid}, use_bin_type=True)])
        self.serve(lambda: rid in t.replies)
        reply = t.replies.pop(rid)
        if "error" in reply:
            raise RuntimeError(f"the controller refused {header['t']}: {reply['error']}")
        return reply

    # the measured phase -------------------------------------------------------------
    def prepare(self, launches: int) -> int:
        """Pack ``launches`` chained launches (split over every slice) ahead of time."""
        slices = sum(len(t.slices) for t in self.tenants)
        rounds = max(1, launches // slices)
        for t in self.tenants:
            t.batches.clear()
            for r0 in range(0, rounds, ROUNDS_PER_BATCH):
                packed, dead = [], []
                for _ in range(r0, min(r0 + ROUNDS_PER_BATCH, rounds)):
                    for sid in t.slices:
                        lid, out = t.next_id(), t.next_id()
                        head = t.heads[sid]
                        launch = {
                            "t": "launch",
                            "lid": lid,
                            "slice": sid,
                            "pid": PID,
                            "ins": [head],
                            "outs": [out],
                            "donate": [],
                        }
                        packed.append(pack(launch))
                        dead.append(head)
                        t.heads[sid] = out
                n = len(packed)
                # As the real client: deletions leave after the launches that read them.
                packed.append(pack({"t": "delete", "handles": dead}))
                t.batches.append((encode_batch(packed), n))
        return rounds * slices

    def status_seconds(self, n: int) -> list[float]:
        """Round trips of ``n`` status requests (the snapshot widgets and magics poll)."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.request(self.tenants[0], {"t": "status"})
            out.append(time.perf_counter() - t0)
        return out

    def submit_all(self, total: int) -> tuple[float, float]:
        """Wall and this process's CPU seconds until every launch is done."""
        for t in self.tenants:
            t.done = 0
        c0, t0 = time.process_time(), time.perf_counter()
        self.serve(lambda: sum(t.done for t in self.tenants) >= total, pump=True)
        return time.perf_counter() - t0, time.process_time() - c0

    def _pump(self) -> None:
        # Round-robin over tenants, a batch each per turn, within each one's back-pressure.
        sent = True
        while sent:
            sent = False
            for t in self.tenants:
                if t.batches and t.outstanding + t.batches[0][1] <= t.max_queued:
                    frame, n = t.batches.popleft()
                    t.sock.send_multipart([frame])
                    t.outstanding += n
                    sent = True

    # the loop -----------------------------------------------------------------------
    def serve(self, until: Callable[[], bool], pump: bool = False) -> None:
        deadline = time.monotonic() + TIMEOUT
        heartbeat = msgpack.packb({"t": "heartbeat"}, use_bin_type=True)
        while not until():
            if pump:
                self._pump()
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"no progress within {TIMEOUT:.0f} s")
            if now >= self.next_beat:
                # Hosts beat every second, as real ones do; clients keep their leases.
                for s in self.hosts:
                    s.send_multipart([heartbeat])
                for t in self.tenants:
                    t.sock.send_multipart([heartbeat])
                self.next_beat = now + 1.0
            for sock, _ in self.poller.poll(100):
                handler = self.handlers[sock]
                for frames in receive(sock, 10_000):
                    handler(sock, frames)

    def _on_host(self, sock: DealerSocket, frames: list[Any]) -> None:
        h = _unpack(frames[0])
        kind = h["t"]
        if kind == "batch":
            now = time.time()
            end = now + FAKE_DEVICE_SECONDS
            items = [[m["lid"], now, end, None] for m in h["msgs"] if m["t"] == "run"]
            if items:
                sock.send_multipart(
                    [msgpack.packb({"t": "acks", "items": items}, use_bin_type=True)]
                )
        elif kind == "run":
            now = time.time()
            item = [h["lid"], now, now + FAKE_DEVICE_SECONDS, None]
            sock.send_multipart([msgpack.packb({"t": "acks", "items": [item]}, use_bin_type=True)])
        elif kind == "program":
            self.nout[h["pid"]] = h["nout"]
        elif kind == "host_probe":
            specs: list[Any] = [[] for _ in range(self.nout.get(h["pid"], 1))]
            reply = {"t": "host_reply", "rid": h["rid"], "out_specs": specs}
            sock.send_multipart([msgpack.packb(reply, use_bin_type=True)])
        elif kind == "welcome":
            self.welcomed += 1
        elif kind in ("refuse", "error"):
            raise RuntimeError(f"the controller told a fake host: {h}")
        # drop, fail_outputs, cancel_runs, fault: nothing to do without devices.

    def _on_tenant(self, sock: DealerSocket, frames: list[Any]) -> None:
        t = self.of_sock[sock]
        h = _unpack(frames[0])
        kind = h["t"]
        if kind == "done":
            items = h["items"]
            for _, err in items:
                if err is not None:
                    raise RuntimeError(f"a launch failed at the controller: {err}")
            t.outstanding -= len(items)
            t.done += len(items)
        elif kind == "reply":
            t.replies[h["rid"]] = h
        elif kind == "welcome":
            t.tenant, t.max_queued = h["tenant"], h["max_queued"]
            t.ids = HandleAllocator(t.tenant)
        else:
            raise RuntimeError(f"the controller told a tenant: {h}")

    def close(self) -> None:
        for s in [*self.hosts, *(t.sock for t in self.tenants)]:
            s.close(0)


def _put_note(handle: int, sid: str) -> bytes:
    return pack({"t": "put_note", "handle": handle, "slice": sid, "nbytes": 4096})


def load_process(conn: Connection) -> None:
    """The spawned process: one :class:`_Load` per point, driven over ``conn``."""
    ctx: zmq.Context[Any] = zmq.Context()
    load: _Load | None = None
    try:
        while True:
            cmd, arg = conn.recv()
            if cmd == "exit":
                break
            if cmd == "setup":
                load = _Load(ctx, arg["client_address"], arg["host_address"])
                conn.send(("ok", load.setup(arg["hosts"], arg["tenants"], arg["live_arrays"])))
            elif load is None:
                raise RuntimeError(f"{cmd!r} before any setup")
            elif cmd == "prepare":
                conn.send(("ok", load.prepare(arg)))
            elif cmd == "go":
                conn.send(("ok", load.submit_all(arg)))
            elif cmd == "status":
                conn.send(("ok", load.status_seconds(arg)))
            elif cmd == "close":
                load.close()
                load = None
                conn.send(("ok", None))
            else:
                raise RuntimeError(f"unknown command {cmd!r}")
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if load is not None:
            load.close()
        ctx.term()
