"""The executor: one dispatch thread launches programs in the gang scheduler's order (or
the socket thread does, inline, when nothing is queued before them, and when an array it
stored lets parked work go); their completions are recorded by
:mod:`pathways_nb.worker._completion`.

Shutdown order: stop() puts a sentinel on the dispatch queue; the dispatch thread passes
it to the completion thread after draining; both are joined, then the programs' thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from pathways_nb._core import CHECK_FROM, RemoteError, handle_owner
from pathways_nb.worker._completion import STOP, Completions, Done
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._faults import Faults
from pathways_nb.worker._fed import FedPuts
from pathways_nb.worker._finite import nonfinite
from pathways_nb.worker._guards import MemoryGuard, check_donation, program_bytes
from pathways_nb.worker._parking import ParkingLot
from pathways_nb.worker._programs import Program, Programs, run_key
from pathways_nb.worker._sending import SendsInFlight
from pathways_nb.worker._store import Entry, ObjectStore
from pathways_nb.worker._threads import as_host

log = logging.getLogger("pathways_nb.worker")

_RESUME = object()


# A compiled launch's program, executable, donated argument indices and the bytes it
# allocates on this host's devices when it runs (see _guards).
_Plan = tuple[Program, Any, tuple[int, ...], int]


@dataclasses.dataclass(frozen=True)
class ExecutorStatistics:
    programs: int
    executables: int
    compiles: int
    launches: int
    failures: int


class Executor:
    """Runs ``run``/``drop``/``probe`` work items for one host, in arrival order."""

    def __init__(
        self,
        host: str,
        devices: Sequence[jax.Device],
        store: ObjectStore,
        send: Callable[[dict[str, Any]], None],
        put_wait: float = 60.0,
        window: int = 16,
        executables: int = 256,
        colocated_python: bool = True,
    ) -> None:
        self.host = host
        self.store = store
        self._send = send
        self.completions = Completions(host, store, send, window)
        self._reported_parked: set[int] = set()
        self._put_wait = put_wait
        self.programs = Programs(host, devices, executables, colocated_python)
        self.memory = MemoryGuard(host, enabled=all(d.platform == "cpu" for d in devices))
        self.completions.on_released = self.memory.release
        self._faults = Faults(host)
        # Work waiting for the dispatch thread; _busy while one item runs (on the
        # dispatch thread or inline on the socket thread), so order is kept.
        self._pending: collections.deque[Any] = collections.deque()
        self._busy = False
        self._cv = threading.Condition()
        # run message key -> (program, executable, donated argument indices): what a
        # launch needs, found with one lookup once its program is compiled here. As many
        # as the host keeps executables, the least recently launched dropped first.
        self._plans: collections.OrderedDict[tuple[Any, ...], _Plan] = collections.OrderedDict()
        self._threads: list[threading.Thread] = []
        self._launches = 0
        self._failures = 0
        # Work waiting for inputs (see _parking); _retry is set when one may have arrived.
        self._lot = ParkingLot()
        self._retry = False
        # The host's socket thread, and whether an arrival it stored woke parked work.
        self._inline_ident = -1
        self._inline_due = False
        store.on_arrival = self._wake_parked
        self.sends = SendsInFlight(self._cv, self._wake_under_lock)
        # dst handle -> source host, for transfers this host expects.
        self._expected: dict[int, str] = {}
        self.fed = FedPuts()
        # Called with (entry, send body) to ship an array to another host.
        self.send_array: Callable[[Entry, dict[str, Any]], None] | None = None
        # Called with a put's handle when the controller's note of the put comes.
        self.on_noted: Callable[[int], None] | None = None

    # lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._threads = [
            threading.Thread(
                target=as_host(self._dispatch_loop),
                name=f"pw-dispatch-{self.host}",
                daemon=True,
            ),
            threading.Thread(
                target=as_host(self.completions.loop),
                name=f"pw-complete-{self.host}",
                daemon=True,
            ),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        if not self._threads:
            return
        with self._cv:
            self._pending.append(STOP)
            self._cv.notify()
        for t in self._threads:
            t.join()
        self._threads = []
        self.programs.close()

    def submit(self, kind: str, body: Any) -> None:
        """Queue a work item; called by the host's socket thread.

        When nothing is queued or running before it, the item is done at once on the
        calling thread if that is cheap and never waits: a ``run`` whose program is
        compiled (parked if its inputs are absent), a ``send`` (parked if its source is
        absent), a ``recv`` or a ``drop``. That saves a thread hand-off per item and
        keeps the order, which only this thread feeds.
        """
        if kind == "run":
            self.completions.received += 1
        elif kind == "program":
            body = self.programs.add_soon(*body)  # waited for in the island's order
        with self._cv:
            inline = not self._pending and not self._busy
            if inline:
                self._busy = True
        if inline:
            try:
                done = self._try_now(kind, body)
            finally:
                self._end_inline()
            if done:
                return
        with self._cv:
            self._pending.append((kind, body))
            self._cv.notify()

    def _try_now(self, kind: str, body: Any) -> bool:
        """Do a work item on the socket thread if it is cheap and cannot block it;
        False leaves it to the dispatch thread. The caller holds ``_busy``."""
        if kind == "run":
            plan = self._inline_plan(body)
            if plan is None:
                return False
            if not self._lot:
                entries = self.store.get_many(body["ins"])
                if entries is not None:
                    self._run_planned(body, plan, entries)
                    return True
            self._handle(kind, body)
        elif kind in ("send", "drop"):
            self._handle(kind, body)
        elif kind == "recv":
            self._do_recv(body)
        elif kind == "noted":
            self._do_noted(body)
        else:
            return False
        return True

    def _inline_plan(self, h: dict[str, Any]) -> _Plan | None:
        """The launch's plan if it may run on the socket thread: compiled already, no
        injected fault to take, no output check to wait for, and room in XLA's window
        (so the thread never waits)."""
        if self._faults or h.get("check") or not self.completions.has_room():
            return None
        return self._plan(run_key(h))

    def _plan(self, key: tuple[Any, ...]) -> _Plan | None:
        """The plan for a run key, marked recently used."""
        if (plan := self._plans.get(key)) is not None:
            self._plans.move_to_end(key)
        return plan

    def serve_inline_from_this_thread(self) -> None:
        """Called once by the host's socket thread: arrivals it stores resume parked work
        on it (see :meth:`resume_due`) instead of waking the dispatch thread."""
        self._inline_ident = threading.get_ident()

    def resume_due(self) -> None:
        """Resume parked work that arrivals stored on this (the socket) thread woke, here
        and now when the executor is idle; otherwise wake the dispatch thread for it.
        Called by the socket thread after each batch of messages. Saves a thread
        hand-off between an array's arrival and the launch that waited for it."""
        if not self._inline_due:
            return
        with self._cv:
            self._inline_due = False
            if not self._retry:
                return  # the dispatch thread took it meanwhile
            if self._busy or self._pending:
                self._cv.notify()
                return
            self._busy = True
            self._retry = False
        try:
            self._resume_parked(inline=True)
        except Exception:
            log.exception("host %s failed resuming parked work", self.host)
        finally:
            self._end_inline()

    def _end_inline(self) -> None:
        """The socket thread is done with the executor: hand what came meanwhile (queued
        work, an arrival that woke parked work) to the dispatch thread."""
        with self._cv:
            self._busy = False
            if self._pending or self._retry:
                self._cv.notify()

    def cancel_runs(self, tenant: int, message: str) -> int:
        """Drop the tenant's launches that wait in this host's queue; they fail as cancelled.

        Launches parked for their inputs are taken out by the dispatch thread, first thing.
        """
        with self._cv:
            keep: collections.deque[Any] = collections.deque()
            cancelled = []
            for item in self._pending:
                if (
                    item is not STOP
                    and item[0] == "run"
                    and handle_owner(int(item[1]["lid"])) == tenant
                ):
                    cancelled.append(item[1])
                else:
                    keep.append(item)
            keep.appendleft(("cancel_parked", (tenant, message)))
            self._pending = keep
            self._cv.notify()
        for h in cancelled:
            self._fail_run(h, message, "cancelled")
        return len(cancelled)

    def _do_cancel_parked(self, body: tuple[int, str]) -> None:
        tenant, message = body
        for p in self._lot.remove(
            lambda p: p.kind == "run" and handle_owner(int(p.body["lid"])) == tenant
        ):
            self._fail_run(p.body, message, "cancelled")
        self._retry = True  # what they held back may go now

    def _fail_run(self, h: dict[str, Any], message: str, kind: str) -> None:
        prog = self.programs.get(h["pid"])
        name = prog.name if prog is not None else h["pid"]
        sname = h.get("name", h["slice"])
        err = RemoteError(message, kind=kind, program=name, slice=sname, host=self.host)
        for hd in h["outs"]:
            self.store.fail(hd, err)
        self.completions.failed(Done(h["lid"], h["outs"], None, time.time(), err, name, sname, []))

    def _runnable_now(self, h: dict[str, Any]) -> tuple[_Plan, list[Entry]] | None:
        """The launch's plan and input entries if it can run at once, else None."""
        if self._faults:
            return None  # injected faults (delays, crashes) belong on the dispatch thread
        plan = self._plan(run_key(h))
        if plan is None:
            return None
        entries = self.store.get_many(h["ins"])
        return None if entries is None else (plan, entries)

    # dispatch thread ----------------------------------------------------------------
    def _nothing_to_do(self) -> bool:
        return self._busy or not (self._pending or self._retry or self._lot_expired())

    def _dispatch_loop(self) -> None:
        while True:
            with self._cv:
                idle = self._nothing_to_do()
            if idle:
                # Before waiting (outside the lock: it may answer fetches): what this
                # thread dispatched and XLA finished is recorded here, the rest handed on.
                self.completions.reap()
            with self._cv:
                while self._nothing_to_do():
                    self._cv.wait(self._lot.seconds_to_deadline())
                self._busy = True
                if self._retry or self._lot_expired():
                    self._retry = False
                    item: Any = _RESUME
                else:
                    item = self._pending.popleft()
            try:
                if item is STOP:
                    self.completions.stop()
                    return
                if item is _RESUME:
                    self._resume_parked()
                else:
                    self._handle(*item)
            except Exception:
                log.exception("host %s failed a work item", self.host)
            finally:
                with self._cv:
                    self._busy = False

    def _resume_parked(self, inline: bool = False) -> None:
        """Try parked work again, oldest first. An item that is still held back (an
        input absent, a donated input still being sent, or an array an item parked
        before it touches) goes back in its place without being handled again: each
        arrival wakes the whole lot, and most of it is still waiting.

        ``inline``: on the socket thread, which must not compile or wait for room in
        XLA's window; at the first launch that would, the rest stays parked, in order,
        for the dispatch thread.
        """
        now = time.monotonic()
        items = self._lot.take_all()
        for i, p in enumerate(items):
            if now < p.deadline and self._held_back(p.kind, p.body, p.touched):
                self._lot.repark(p)
            elif inline and p.kind == "run" and self._inline_plan(p.body) is None:
                for rest in items[i:]:
                    self._lot.repark(rest)
                with self._cv:
                    self._retry = True
                return
            else:
                self._handle(p.kind, p.body, p.deadline)

    def _held_back(self, kind: str, body: Any, touched: tuple[int, ...]) -> bool:
        """Whether parked work must stay parked. Its absent inputs are watched here, so
        their arrival wakes the lot: an item that parked behind another was parked before
        its inputs were looked at."""
        if self._lot.conflicts(touched):
            return True
        if kind == "run":
            if self.sends.blocks(body["ins"], body["donate"]):
                return True
            return bool(self.store.watch_absent(body["ins"]))
        if kind == "send":
            return bool(self.store.watch_absent((body["src"],)))
        return False

    def _wake_under_lock(self) -> None:
        self._retry = True
        self._cv.notify()

    def _lot_expired(self) -> bool:
        d = self._lot.earliest_deadline()
        return d is not None and time.monotonic() >= d

    def _wake_parked(self) -> None:
        """An input parked work waits for arrived (called by whichever thread stored it).
        The socket thread resumes the work itself once its messages are handled."""
        with self._cv:
            self._retry = True
            if threading.get_ident() == self._inline_ident:
                self._inline_due = True
            else:
                self._cv.notify()

    def _handle(self, kind: str, body: Any, deadline: float | None = None) -> None:
        """Do one work item now, or park it until what it needs is here."""
        if kind == "run":
            touched = (*body["ins"], *body["outs"])
            ins = body["ins"]
            busy = self.sends.blocks(body["ins"], body["donate"])
        elif kind == "send":
            touched, ins, busy = (body["src"],), (body["src"],), False
        elif kind == "drop":
            touched, ins, busy = tuple(body), (), False
        else:
            getattr(self, f"_do_{kind}")(body)
            return
        if deadline is None:
            deadline = time.monotonic() + self._put_wait
        if busy or self._lot.conflicts(touched):
            self._park(kind, body, touched, deadline)
            return
        missing = self.store.watch_absent(ins) if ins else []
        if missing:
            now = time.monotonic()
            if now >= deadline and self.fed.all_awaited(missing):
                deadline = now + self._put_wait  # a Dask task still computes them
            if now < deadline:
                self._park(kind, body, touched, deadline)
                return
            self.store.unwatch(missing)
            self._lost_inputs(kind, body, missing)
            return
        if kind == "run":
            self._reported_parked.discard(body["lid"])
            self.completions.wait_for_room()
        getattr(self, f"_do_{kind}")(body)

    def _park(self, kind: str, body: Any, touched: tuple[int, ...], deadline: float) -> None:
        self._lot.park(kind, body, touched, deadline)
        if kind == "run" and body["lid"] not in self._reported_parked:
            # A parked launch holds no XLA resources: give its window slot back, so the
            # work it waits for (perhaps behind it in this window) can run.
            self._reported_parked.add(body["lid"])
            self._send({"t": "parked", "lids": [body["lid"]]})

    def _lost_inputs(self, kind: str, body: Any, missing: list[int]) -> None:
        where = [
            f"{h:#x}"
            + (f" (a transfer from host {self._expected[h]})" if h in self._expected else "")
            for h in missing
        ]
        message = (
            f"input {', '.join(where)} never arrived on host {self.host} within "
            f"{self._put_wait:.0f} s"
        )
        if kind == "run":
            self._fail_run(body, message, "data_loss")
        elif self.send_array is not None:
            err = RemoteError(message, kind="data_loss", program="transfer", host=self.host)
            self.send_array(Entry(error=err, ready=True), body)

    def _do_recv(self, body: dict[str, Any]) -> None:
        if self.store.get(body["dst"]) is None:
            self._expected[body["dst"]] = body["source"]

    def arrived(self, handle: int) -> None:
        """A transfer into ``handle`` completed (called by the host's socket thread)."""
        self._expected.pop(handle, None)

    def _do_send(self, body: dict[str, Any]) -> None:
        entry = self.store.get(body["src"])
        if entry is None or self.send_array is None:
            return
        self.sends.started(body["src"])
        self.send_array(entry, body)

    def _do_noted(self, body: dict[str, Any]) -> None:
        if self.on_noted is not None:
            self.on_noted(int(body["handle"]))

    def _do_program(self, added: concurrent.futures.Future[None]) -> None:
        added.result()

    def _do_forget(self, pids: list[str]) -> None:
        """No tenant uses these programs any more: their executables and plans go too."""
        gone = set(pids)
        self.programs.forget(gone)
        for key in [k for k in self._plans if k[0] in gone]:
            del self._plans[key]

    def _do_drop(self, handles: list[int]) -> None:
        self.fed.drop(handles)
        self.store.drop(handles)

    def _do_fault(self, body: tuple[str, str, int]) -> None:
        self._faults.arm(*body)

    def _do_fail_outputs(self, body: tuple[list[int], dict[str, Any]]) -> None:
        handles, err = body
        e = RemoteError.from_dict(err)
        for h in handles:
            if self.store.get(h) is None:
                self.store.fail(h, e)

    def _run_planned(
        self, h: dict[str, Any], plan: _Plan, entries: list[Entry], t0: float | None = None
    ) -> None:
        """Run a launch whose executable and inputs are here: the common, lean path.

        ``t0`` is when the launch began here, if earlier than now (an injected delay held
        it; compiling is left out).
        """
        t0 = time.time() if t0 is None else t0
        prog, fn, donate, need = plan
        outs = h["outs"]
        sname = h.get("name", h["slice"])
        reserved = 0
        try:
            args = []
            for e in entries:
                if e.error is not None:
                    raise e.error
                args.append(e.value)
            if self.store.limit or self.store.tenant_limit:
                freeing = sum(entries[i].nbytes for i in donate)
                self.store.reserve_check(prog.total_nbytes, freeing, handle_owner(h["lid"]))
            if need >= CHECK_FROM:
                self.memory.reserve(need, prog.name, sname)
                reserved = need
            donated = [args[i] for i in donate] if donate else []
            if donate:
                check_donation(h["ins"], donate)
                self.completions.donated.update(id(a) for a in donated)
            results = fn(*args)
            if donate:
                ins = h["ins"]
                self.store.drop([ins[i] for i in donate])
            # The exported function is flat: it returns a list of arrays.
            leaves = results if isinstance(results, list) else jax.tree.leaves(results)
            check = h.get("check")
            if check and (bad := nonfinite(check, args, leaves, prog.name, sname, self.host)):
                self.completions.donated.difference_update(id(a) for a in donated)
                raise bad
            self.store.set_many(outs, leaves, prog.out_nbytes, (prog.name, sname))
            self._launches += 1
            done = Done(h["lid"], outs, leaves, t0, None, prog.name, sname, donated, reserved)
            reserved = 0  # the completion releases it now
            self.completions.dispatched(done)
        except Exception as exc:
            if reserved:
                self.memory.release(reserved)
            self._failed(h, exc, prog.name, sname, t0)

    def _failed(self, h: dict[str, Any], exc: Exception, name: str, sname: str, t0: float) -> None:
        """A launch failed here before or while XLA ran it: its outputs hold the error."""
        err = to_remote(exc, "runtime", program=name, slice=sname, host=self.host)
        for hd in h["outs"]:
            self.store.fail(hd, err)
        self._failures += 1
        self.completions.failed(Done(h["lid"], h["outs"], None, t0, err, name, sname, []))

    def _do_run(self, h: dict[str, Any]) -> None:
        """Run a launch on the dispatch thread: compile it first if need be, and take any
        injected fault; then the lean path runs it."""
        if not self._faults:
            ready = self._runnable_now(h)
            if ready is not None:
                self._run_planned(h, *ready)
                return
        t0 = time.time()
        name, sname = h["pid"], h.get("name", h["slice"])
        try:
            key = run_key(h)
            plan = self._plan(key)
            prog = plan[0] if plan is not None else self.programs.program(h["pid"])
            name = prog.name
            self._faults.take(name, handle_owner(int(h["lid"])))
            entries = []
            for hd in h["ins"]:
                entry = self.store.get(hd)
                if entry is None:  # dropped meanwhile: the client deleted it
                    raise RemoteError(f"input {hd:#x} was deleted", kind="invalid")
                if entry.error is not None:
                    raise entry.error
                entries.append(entry)
            if plan is None:
                donate = tuple(sorted(int(i) for i in h["donate"]))
                if self.store.limit or self.store.tenant_limit:
                    # A full store fails the launch before it compiles.
                    freeing = sum(entries[i].nbytes for i in donate)
                    self.store.reserve_check(prog.total_nbytes, freeing, handle_owner(h["lid"]))
                compiling = time.time()
                try:
                    fn = self.programs.executable(
                        h["pid"], self.programs.mesh(h["devices"], h["mesh"]), donate
                    )
                    # Compiling is not running: the event log, the tenant's device
                    # seconds and the gang scheduler's cost estimate leave it out (a
                    # first compile made a program look a hundred times dearer).
                    t0 += time.time() - compiling
                except Exception as exc:
                    raise to_remote(
                        exc, "compile", program=name, slice=sname, host=self.host
                    ) from None
                plan = (prog, fn, donate, program_bytes(fn, len(h["devices"])))
                # A Python function runs here each time, never inline on the socket
                # thread (see _python): it takes no plan the socket thread would find.
                if prog.python is None:
                    self._plans[key] = plan
                if len(self._plans) > self.programs.max_executables:
                    self._plans.popitem(last=False)
        except Exception as exc:
            self._failed(h, exc, name, sname, t0)
            return
        self._run_planned(h, plan, entries, t0)

    def statistics(self) -> ExecutorStatistics:
        return ExecutorStatistics(
            programs=self.programs.count,
            executables=self.programs.executables,
            compiles=self.programs.compiles,
            launches=self._launches,
            failures=self._failures + self.completions.failures,
        )
