"""The Client: one notebook's session with the controller."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

import zmq

from pathways_nb._core import (
    BrokenError,
    BusyError,
    ClosedError,
    DataLossError,
    HandleAllocator,
    PathwaysError,
    RemoteError,
    VersionMismatchError,
    default_config,
    encode_mesh,
    local_versions,
    validate_mesh_shape,
    validate_weight,
)
from pathways_nb.client._arrays import ArrayIO
from pathways_nb.client._direct import DirectChannels
from pathways_nb.client._discovery import (
    address_from_file,
    ask_scheduler,
    client_tls,
    security_for,
    security_from_file,
)
from pathways_nb.client._graph import DataflowGraph, Recording, trace_graph
from pathways_nb.client._io import IOThread
from pathways_nb.client._jit import RemoteFunction
from pathways_nb.client._prefetch import Prefetcher
from pathways_nb.client._profile import Profile
from pathways_nb.client._slice import VirtualSlice, axis_types_for
from pathways_nb.client._status import EventRows, Status, epoch_seconds, events_frame

# Every client of this process that has not been closed: an allocation refused for want
# of devices names those holding slices on the same controller (a notebook cell that
# made a client, run again, leaves the earlier one holding its slices).
_OPEN: weakref.WeakSet[Client] = weakref.WeakSet()
# Clients in the order they connected (Client.current: the latest still open).
_CONNECTED = itertools.count()


class Client(ArrayIO):
    """A session with a pathways controller.

    >>> with pw.LocalCluster(islands=2, devices_per_island=4) as cluster:
    ...     client = pw.Client(cluster)
    ...     vs = client.allocate({"data": 4})

    ``address`` is a cluster object (``pw.LocalCluster``, ``pw.InProcessCluster``, or
    any Dask cluster whose scheduler has the pathways preload) or a Dask scheduler
    address; ``scheduler_file=`` reads that address from the file ``pathways-nb cluster
    --scheduler-file`` (or ``dask scheduler --scheduler-file``) writes. ``controller=``
    connects straight to a controller's address. ``name`` and ``weight`` are this
    tenant's in ``client.status()`` and its share of contended islands (weight 3 gets
    three times the device time of weight 1 while both have work queued).
    ``dask_client`` is the ``distributed.Client`` that computes puts of Dask arrays (by
    default this cluster's scheduler's current Dask client, or one made on first use;
    see :attr:`dask_client`).

    A cluster whose Dask scheduler uses TLS (``tls://``) is reached with its
    certificates: ``security=`` (a ``distributed.Security`` holding the CA and a client
    certificate), else the cluster object's own (``pw.LocalCluster(security=True)``, a
    Dask cluster's ``.security``), else Dask's configuration (``distributed.comm.tls.*``).
    Every link of the client (to the controller, and straight to hosts for puts and
    fetches) then runs over TLS too.

    ``observer=True`` makes a read-only client, for dashboards: it reads
    :meth:`status` and the event log, and nothing else. It is no tenant: it holds no
    slices, takes no share of the islands, is not listed among the tenants, and never
    becomes :meth:`current`. Running nothing itself, it sees every tenant's newest
    events in :meth:`status`, and the live widgets drawn from it show every tenant's work.
    """

    _current: ClassVar[Client | None] = None

    def __init__(
        self,
        address: Any = None,
        *,
        controller: str | None = None,
        context: zmq.Context[Any] | None = None,
        name: str = "",
        weight: float = 1.0,
        timeout: float = 30.0,
        scheduler_file: str | os.PathLike[str] | None = None,
        dask_client: Any = None,
        observer: bool = False,
        security: Any = None,
    ) -> None:
        if not isinstance(observer, bool):
            raise TypeError(f"observer is True or False; got {observer!r}")
        self.observer = observer
        adopt: Callable[[Client], None] | None = None
        self.scheduler_address: str | None = None
        weight = validate_weight(weight)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout is seconds to wait for the controller, > 0; got {timeout!r}")
        if scheduler_file is not None:
            if address is not None:
                raise ValueError("give pw.Client an address or a scheduler_file, not both")
            address = address_from_file(scheduler_file)
            security = security or security_from_file(scheduler_file)
        if controller is None:
            if address is None:
                raise ValueError(
                    "pw.Client needs a cluster (pw.LocalCluster(...), pw.InProcessCluster(...)), "
                    "a Dask scheduler address such as 'tcp://host:8786', or scheduler_file= "
                    "(the file `pathways-nb cluster` or `dask scheduler` writes)"
                )
            adopt = getattr(address, "adopt", None)
            if adopt is not None:
                # An in-process cluster: its sockets are inproc://, so this client
                # shares its ZeroMQ context, and closing the cluster closes the client.
                if getattr(address, "closed", False):
                    raise ClosedError("this in-process cluster was closed; start a new one")
                context = context or address.context
                controller = address.controller_address
        if controller is None:
            addr = getattr(address, "scheduler_address", address)
            if not isinstance(addr, str):
                raise TypeError(
                    "pw.Client expects a cluster or an address string; "
                    f"got {type(address).__name__}"
                )
            security = security_for(addr, security or getattr(address, "security", None))
            controller = (
                getattr(address, "controller_address", None)
                or ask_scheduler(addr, timeout, security=security)["address"]
            )
            self.scheduler_address = addr
        else:
            security = security_for(controller, security)
        # The cluster's distributed.Security when it uses TLS (see _core._tls), else None.
        self.security: Any = security
        tls = client_tls(security)
        self.controller_address = controller
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: dict[int, list[int]] = {}
        self._errors: dict[int, RemoteError] = {}
        self._asked: dict[int, Future[Any]] = {}
        self._asked_lock = threading.Lock()
        self._fed: dict[int, Any] = {}
        self._dask: Any = dask_client
        self._own_dask = False
        self._dask_hosts: set[str] = set()
        self._programs_sent: set[str] = set()
        self._hosts_ok: set[str] = set()
        self._slices: dict[str, VirtualSlice] = {}
        # Small programs behind RemoteArray operators, least recently used first.
        self._ops: collections.OrderedDict[tuple[Any, ...], RemoteFunction] = (
            collections.OrderedDict()
        )
        self.default_slice: VirtualSlice | None = None
        self._closed = False
        self._io = IOThread(self._ctx, controller, self._on_push, heartbeat=1.0, tls=tls)
        self._io.start()
        versions = local_versions()
        self._direct = DirectChannels(self._ctx, tls)
        self._prefetcher = Prefetcher(self._fetch_one)
        self._profiles: set[Profile] = set()  # running ones, stopped at close
        try:
            h, _ = self._io.request(
                {
                    "t": "hello",
                    "role": "client",
                    "versions": versions.to_dict(),
                    "name": name,
                    "weight": float(weight),
                    **({"observer": True} if observer else {}),
                }
            ).result(timeout)
        except TimeoutError:
            self._io.stop()
            raise BrokenError(
                f"the controller at {controller} did not answer within {timeout:.0f} s"
            ) from None
        if h["t"] == "refuse":
            self._io.stop()
            raise VersionMismatchError(f"the controller refused this client: {h.get('reason')}")
        self.tenant: int = int(h["tenant"])
        # What this client's hello to a host shows: its tenant, and the controller's
        # token for it (hosts serve a connection only its tenant's arrays).
        self._direct.hello = {
            "t": "hello",
            "role": "client",
            "versions": versions.to_dict(),
            "tenant": self.tenant,
            "token": h.get("token"),
        }
        self.window: int = int(h.get("window", 16))
        self.max_queued: int = int(h.get("max_queued", 10_000))
        # Seconds new work for a lost slice waits for its remap (0: fails at once); a
        # controller that does not remap lost slices makes it 0.
        self.remap_wait_seconds: float = (
            default_config().remap_wait_seconds if h.get("remaps") else 0.0
        )
        self._ids = HandleAllocator(self.tenant)
        self._opened = next(_CONNECTED)
        if not observer:
            Client._current = self
            _OPEN.add(self)
        self._finalizer = weakref.finalize(self, IOThread.stop, self._io)
        if adopt is not None:
            adopt(self)

    # lifecycle ------------------------------------------------------------------------
    @classmethod
    def current(cls) -> Client:
        """The most recently connected client that is still open."""
        c = cls._current
        if c is None or c._closed:
            raise ClosedError("no open pathways client: create one with pw.Client(cluster)")
        return c

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the controller went away for good)."""
        return self._closed

    def close(self) -> None:
        """Say goodbye (the controller frees this client's slices) and stop. Idempotent."""
        if self._closed:
            return
        for prof in list(self._profiles):
            prof._abandon()  # the hosts stop tracing; their files stay
        self._closed = True
        _OPEN.discard(self)
        self._prefetcher.stop()
        self._close_dask()
        self._io.stop()
        self._direct.close()
        # The controller frees a departed client's slices: they read released, and
        # releasing one again is the no-op it always is.
        for vs in list(self._slices.values()):
            vs._set_state("released")
        self._slices.clear()
        if self._own_ctx:
            self._ctx.term()
        if Client._current is self:
            # The one connected before it, if still open, is current again.
            Client._current = max(
                (c for c in _OPEN if not c._closed), key=lambda c: c._opened, default=None
            )

    def __reduce__(self) -> Any:
        # Its sockets and threads belong to this process; a Dask task or a process
        # started with spawn would otherwise fail deep in pickle.
        how = f"pw.Client({self.scheduler_address!r})" if self.scheduler_address else "pw.Client"
        raise TypeError(
            "a pw.Client cannot be pickled: its connections belong to this process. In "
            f"another process connect a client of its own to the cluster ({how})"
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.slices)} slices"
        tenant = getattr(self, "tenant", "?")
        return f"<pathways_nb.Client tenant={tenant} {state} {self.controller_address}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this client was closed; create a new pw.Client")
        if self._io.broken is not None:
            raise BrokenError(self._io.broken)

    def _ask(self, header: dict[str, Any], timeout: float | None = 60.0) -> dict[str, Any]:
        self._check_open()
        h, _ = self._io.request(header).result(timeout)
        if "error" in h:
            err = h["error"]
            if "traceback" in err:  # a RemoteError, from a host or the controller
                raise RemoteError.from_dict(err)
            kind = err.get("kind")
            cls: type[Exception] = {
                "BusyError": BusyError,
                "ClosedError": ClosedError,
                "ValueError": ValueError,
                "KeyError": KeyError,
                "TypeError": TypeError,
            }.get(kind, PathwaysError)
            raise cls(err.get("message", ""))
        if h["t"] == "error":
            raise PathwaysError(h.get("message", ""))
        return h

    # slices ---------------------------------------------------------------------------
    def allocate(
        self, mesh: dict[str, int], name: str | None = None, axis_types: Any = None
    ) -> VirtualSlice:
        """A virtual slice of shape ``mesh`` (e.g. ``{"data": 4}``) on one island.

        ``axis_types`` are ``jax.make_mesh``'s: None leaves every axis Auto (the
        compiler propagates shardings); ``AxisType.Explicit`` (or ``"explicit"``), for
        all axes or one per axis, makes shardings part of the types while tracing."""
        if self.observer:
            raise ClosedError(
                "this client observes only (pw.Client(..., observer=True)): it reads the "
                "status and the event log; connect a pw.Client without observer=True to "
                "allocate slices"
            )
        shape = validate_mesh_shape(mesh)
        types = axis_types_for(axis_types, list(shape))
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a slice's name is a string (or None); got {type(name).__name__}")
        try:
            h = self._ask(
                {
                    "t": "allocate",
                    "mesh": encode_mesh(shape),
                    "name": name,
                    "axis_types": [t.name for t in types],
                }
            )
        except BusyError as exc:
            others = [c for c in list(_OPEN) if c is not self and not c.closed]
            held = {
                c.tenant: [s.name for s in c.slices]
                for c in others
                if c.controller_address == self.controller_address and c.slices
            }
            if not held:
                raise
            which = "; ".join(f"tenant {t}: slices {names}" for t, names in sorted(held.items()))
            raise BusyError(
                f"{exc} Other pw.Clients of this process, not closed, hold slices there "
                f"({which}): close the ones no longer used (client.close(), or "
                "`with pw.Client(...) as client:`) or release their slices."
            ) from None
        s = h["slice"]
        vs = VirtualSlice(
            self,
            s["slice"],
            s["name"],
            shape,
            s["island"],
            s["host"],
            s["devices"],
            h["data_address"],
            h["platform"],
            h.get("bounded") is True,
            types,
        )
        self._hello_host(vs.data_address)
        self._slices[vs.id] = vs
        if self.default_slice is None:
            self.default_slice = vs
        return vs

    def _greet_host(self, address: str) -> None:
        """Say hello to a host without waiting for its answer (on the IO thread, which
        delivers that answer): what this client sends it later queues behind the hello."""
        if address in self._hosts_ok:
            return

        def answered(fut: Any) -> None:
            exc = fut.exception()
            h = None if exc is not None else fut.result()[0]
            if h is not None and h["t"] == "welcome":
                self._hosts_ok.add(address)
            else:
                why = exc if h is None else h.get("reason")
                logging.getLogger("pathways_nb.client").warning(
                    "host at %s did not welcome this client: %s", address, why
                )

        self._io.host_request(address, dict(self._direct.hello)).add_done_callback(answered)

    def _hello_host(self, address: str) -> None:
        if address in self._hosts_ok:
            return
        h, _ = self._io.host_request(address, dict(self._direct.hello)).result(30)
        if h["t"] == "refuse":
            raise VersionMismatchError(f"host at {address} refused this client: {h.get('reason')}")
        self._hosts_ok.add(address)

    def release(self, vs: VirtualSlice) -> None:
        """Free slice ``vs`` (as ``vs.release()``): its devices go back to the pool and
        its arrays are deleted. Releasing twice is a no-op."""
        if not isinstance(vs, VirtualSlice):
            raise TypeError(
                "client.release expects a VirtualSlice from client.allocate(...); "
                f"got {type(vs).__name__}"
            )
        if vs._client is not self:
            raise ValueError(
                f"slice {vs.id!r} belongs to another client; release it with that client"
            )
        vs.release()

    def _release(self, vs: VirtualSlice) -> None:
        self._ask({"t": "release", "slice": vs.id})
        vs._set_state("released")
        self._slices.pop(vs.id, None)  # its arrays know it; this client need not
        if self.default_slice is vs:
            self.default_slice = None

    @property
    def slices(self) -> list[VirtualSlice]:
        return [s for s in self._slices.values() if s.state == "active"]

    def _is_done(self, lid: int) -> bool:
        return lid not in self._pending

    def _delete_soon(self, handle: int, nbytes: int = 0, wake: bool = False) -> None:
        if self._fed and self._defer_delete(handle):
            return
        if not self._closed:
            self._errors.pop(handle, None)
            self._io.delete_soon(handle, nbytes, wake)

    # notifications from the IO thread -------------------------------------------------
    def _on_push(self, h: dict[str, Any]) -> None:
        t = h["t"]
        if t == "done":
            with self._cond:
                for lid, err in h["items"]:
                    outs = self._pending.pop(lid, None)
                    if err and outs:
                        e = RemoteError.from_dict(err)
                        for o in outs:
                            self._errors[o] = e
                self._cond.notify_all()
        elif t == "host_lost":
            if self._fed:
                self._dask_host_lost(h["host"])
            for sid in h["slices"]:
                vs = self._slices.get(sid)
                if vs is not None:
                    vs._set_state("lost")
                    self._io.fail_host(
                        vs.data_address,
                        DataLossError(f"host {h['host']} was lost", slice=vs.name, host=h["host"]),
                    )
                    self._io.forget_host(vs.data_address)
                    self._direct.forget(vs.data_address)
        elif t == "remapped":
            vs = self._slices.get(h["slice"]["slice"])
            if vs is not None:
                self._greet_host(h["data_address"])
                vs._remapped(h["slice"], h["data_address"], h["platform"], h.get("bounded") is True)
        elif t == "error":
            logging.getLogger("pathways_nb.client").warning("controller: %s", h.get("message"))

    # controller queries ---------------------------------------------------------------
    # the dataflow graph ---------------------------------------------------------------
    def graph(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DataflowGraph:
        """The dataflow graph of ``fn(*args, **kwargs)`` from shapes alone: nothing runs.

        >>> g = client.graph(lambda x: dec(enc(x)), x)
        >>> g.nodes, g.edges, g.to_dot()
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(
                "client.graph takes the step to trace and its arguments, e.g. "
                f"client.graph(step, params, batch); got {type(fn).__name__} for the step"
            )
        return trace_graph(self, fn, *args, **kwargs)

    def record(self, name: str = "step") -> Recording:
        """Run a step and record its dataflow graph; ``graph.annotate()`` adds its times.

        >>> with client.record() as g:
        ...     params, loss = step(params, batch)
        >>> g.annotate().nodes[["name", "start", "end"]]
        """
        self._check_open()
        return Recording(self, name)

    def profile(
        self,
        path: str | os.PathLike[str],
        *,
        slices: Any = None,
        python: bool = False,
        limit: float = 600.0,
    ) -> Profile:
        """XLA's profiler (``jax.profiler``) on the hosts of this client's slices, each
        writing its trace under ``path`` on the hosts' filesystem (see :class:`Profile`).

        >>> with client.profile("/tmp/profiles/step") as prof:
        ...     state = step(state, batch)
        >>> prof.hosts        # each host's folder and files; tensorboard --logdir works
        """
        self._check_open()
        return Profile(self, path, slices=slices, python=python, limit=limit)

    def cancel(self) -> int:
        """Cancel this client's launches that have not started, wherever they wait.

        Returns how many the controller still held; those already on a host's queue are
        cancelled there too and fail the same way (``RemoteError`` of kind "cancelled").
        """
        if self._closed:
            return 0
        with contextlib.suppress(Exception):
            return int(self._ask({"t": "cancel"}, timeout=10).get("cancelled", 0))
        return 0

    def status(self) -> Status:
        """A snapshot of the cluster: islands, devices, slices, tenants (see
        :class:`Status`; its DataFrames are built when first read)."""
        return Status.from_reply(self._ask({"t": "status"})["status"])

    def event_rows(self, after: int = 0, since: Any = 0.0, all_tenants: bool = False) -> EventRows:
        """This client's events (every client's with ``all_tenants``) logged after the
        ``after``-th, as plain rows in ``Status.COLUMNS["events"]`` order, and the cursor
        to pass next time: what a live view polls without building a DataFrame each
        time. ``since`` (a time, as for :meth:`events`) leaves out older events: a view
        of the last seconds of a long run starts without reading the whole log.

        >>> rows, cursor = client.event_rows(0, since=time.time() - 10)
        >>> rows, cursor = client.event_rows(cursor)   # later: only the new ones
        """
        h = self._events_reply(since, all_tenants, after)
        return EventRows(h["events"], int(h["next"]))

    def _events_reply(self, since: Any, all_tenants: bool, after: int | None) -> Any:
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63
        ):
            raise TypeError(f"after is a cursor (0, or the next of an earlier call); got {after!r}")
        if not isinstance(all_tenants, bool):
            raise TypeError(f"all_tenants is True or False; got {all_tenants!r}")
        header = {"t": "events", "since": epoch_seconds(since), "all": all_tenants}
        if after is not None:
            header["after"] = after
        return self._ask(header)

    def events(self, since: Any = 0.0, all_tenants: bool = False, after: int | None = None) -> Any:
        """The event log as a pandas DataFrame (launch/start/end/... with host and times).

        ``since`` keeps events at or after that time: seconds since the epoch
        (``time.time()``), or a ``datetime``/``pd.Timestamp``/``np.datetime64`` such as a
        value of the frame's ``time`` column (naive times are UTC, as that column's are). For
        following the log as it grows, pass ``after=0`` and then each time the number in
        ``df.attrs["next"]``: only events logged since the last call come back.
        """
        h = self._events_reply(since, all_tenants, after)
        df = events_frame(h["events"])
        if "next" in h:
            df.attrs["next"] = int(h["next"])
        return df

    def inject_fault(self, where: VirtualSlice | str, match: str = "", kind: str = "error") -> None:
        """Test hook: the next of this client's programs whose name contains ``match``
        on that host fails (other clients' programs never take the fault).

        ``kind="error"`` stores an error in its outputs; ``kind="crash"`` kills the host
        process (a real host loss), refused on a host where another client has a slice;
        ``kind="delay:2.5"`` holds the host's queue for that long before running it.
        """
        if kind not in ("error", "crash") and not kind.startswith("delay:"):
            raise ValueError(f"kind must be 'error', 'crash' or 'delay:SECONDS'; got {kind!r}")
        target = where.id if isinstance(where, VirtualSlice) else str(where)
        self._ask({"t": "inject_fault", "host": target, "match": match, "kind": kind})

    def pending(self) -> int:
        """Launches submitted by this client that have not finished."""
        return len(self._pending)

    def wait_all(self, timeout: float | None = None) -> None:
        """Block until every launch this client submitted has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{len(self._pending)} launches still pending")
                self._cond.wait(0.05)


def graph(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DataflowGraph:
    """The dataflow graph of ``fn(*args, **kwargs)`` on the current client; see
    :meth:`Client.graph`."""
    return Client.current().graph(fn, *args, **kwargs)
