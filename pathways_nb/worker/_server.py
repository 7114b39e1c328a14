"""A worker host's socket thread: the controller connection and the data plane.

One thread owns a DEALER to the controller, a ROUTER that clients ``put`` to and
``fetch`` from directly, and an Outbox through which the executor and the fetch pool
send. Shutdown order: stop the loop, join it, stop the executor, stop the pool, close
the sockets.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import zmq
from jax.sharding import NamedSharding

from pathways_nb._core import (
    NO_TLS,
    BrokenError,
    Config,
    ProtocolError,
    RemoteError,
    ResourceExhaustedError,
    TLSContexts,
    VersionMismatchError,
    decode_dtype,
    decode_spec,
    default_config,
    handle_owner,
    local_versions,
)
from pathways_nb.wire import (
    AnySocket,
    Outbox,
    Poller,
    bind_router,
    check,
    connect_dealer,
    decode,
    departed,
    encode,
    new_inproc_address,
    peer_id,
    receive,
    sends_from_any_thread,
)
from pathways_nb.wire._messages import error_header
from pathways_nb.wire._recvpool import POOL as RECEIVE_POOL
from pathways_nb.worker._answers import Answers
from pathways_nb.worker._checkpoint import Checkpoints
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._executor import Executor, ExecutorStatistics
from pathways_nb.worker._hlo import placed_by
from pathways_nb.worker._hostcopy import from_host
from pathways_nb.worker._peers import CLIENT_REQUESTS, Peers
from pathways_nb.worker._priority import lower_native_threads
from pathways_nb.worker._profiles import Profiles
from pathways_nb.worker._puts import WaitingPuts
from pathways_nb.worker._store import ObjectStore, StoreStatistics
from pathways_nb.worker._threads import as_host
from pathways_nb.worker._transfer import Assembler, Sender

log = logging.getLogger("pathways_nb.worker")

_CONTROLLER_TYPES = frozenset(
    {
        "welcome",
        "refuse",
        "error",
        "program",
        "run",
        "drop",
        "host_probe",
        "fault",
        "fail_outputs",
        "cancel_runs",
        "forget_programs",
        "batch",
    }
)
_BATCHED_TYPES = frozenset({"run", "drop", "send", "recv", "noted"})
# On the data plane: a peer's hello, a client's requests, another host's transfers.
_DATA_TYPES = frozenset({"hello", "xfer", *CLIENT_REQUESTS})
_TO_CONTROLLER = b"c"
_HEARTBEAT = 1.0  # seconds between heartbeats to the controller
# Seconds a put that did not fit waits for the controller's note of it (see _puts).
_PUT_NOTE_WAIT = 30.0


class Host:
    """One worker host: owns ``devices`` and serves programs the controller sends."""

    def __init__(
        self,
        name: str,
        controller_address: str,
        *,
        devices: Sequence[jax.Device] | None = None,
        island: str | None = None,
        config: Config | None = None,
        context: zmq.Context[Any] | None = None,
        bind_host: str = "127.0.0.1",
        inproc: bool = False,
        own_process: bool = False,
        tls: TLSContexts = NO_TLS,
    ) -> None:
        self.name = name
        self._tls = tls  # a cluster that uses TLS: see _core._tls
        self.island = island or name
        self.config = config or default_config()
        self.config.check_checkpoint_root()
        self.devices = list(devices if devices is not None else jax.local_devices())
        self._controller_address = controller_address
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._bind_host = bind_host
        self._inproc = inproc
        # The process is this host's alone (a cluster worker): it may lower the priority
        # of XLA's threads (see _priority), which an embedded host must leave alone.
        self._own_process = own_process
        if own_process:
            # Arrays from other hosts and clients land in kept buffers (see _recvpool);
            # an embedded host leaves its process's (the notebook's) memory alone.
            RECEIVE_POOL.max_bytes = self.config.receive_pool_bytes
        self.store = ObjectStore(self.config.store_limit_bytes)
        self._outbox = Outbox()
        self.executor = Executor(
            name,
            self.devices,
            self.store,
            self._to_controller,
            self.config.put_wait_seconds,
            window=self.config.inflight_window,
            executables=self.config.host_executables,
            colocated_python=self.config.colocated_python,
        )
        self._sender = Sender(self._ctx, name, self.executor.sends.finished, self.store, tls)
        self.executor.send_array = self._sender.submit
        self._waiting_puts = WaitingPuts()
        self.executor.on_noted = self._noted
        self.executor.completions.on_computed = self._sender.computed
        self._assembler = Assembler(
            {int(d.id): d for d in self.devices}, self.executor.programs.mesh, self._arrived
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix=f"pw-fetch-{name}")
        self._answers = Answers(name, self.store, self._to_client, self._pool)
        self._checkpoints = Checkpoints(
            name,
            self.store,
            self._pool,
            self._to_client,
            self._store_or_park,
            self._put_failed,
            self.config.checkpoint_root,
        )
        self._profiles = Profiles(name, self._pool, self._to_client, self._checkpoints.confined)
        self._versions = local_versions()
        self._peers = Peers(name, self._versions)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._registered = threading.Event()
        self._refused: str | None = None
        self.data_address = ""
        self._loop_ident = -1
        # Arrivals the socket thread acknowledges once its messages are handled.
        self._arrival_acks: list[Any] = []
        self._direct_ctl = False
        self._direct_data = False

    # lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Host:
        """Bind the data plane, register with the controller, start serving."""
        if self._thread is not None:
            return self
        addr = (
            new_inproc_address(f"host-{self.name}")
            if self._inproc
            else f"tcp://{self._bind_host}:0"
        )
        self._data, self.data_address = bind_router(
            self._ctx, addr, self.config.max_data_message, tls=self._tls.server
        )
        self._ctl = connect_dealer(
            self._ctx,
            self._controller_address,
            self.config.max_control_message,
            peer="the controller",
            tls=self._tls,
        )
        self._direct_ctl = sends_from_any_thread(self._ctl)
        self._direct_data = sends_from_any_thread(self._data)
        if self._own_process and self.devices and self.devices[0].platform == "cpu":
            c = self.config
            nice, spread, idle = c.cpu_device_nice, c.cpu_device_spread, c.cpu_device_idle
            self.executor.programs.after_compile = lambda: lower_native_threads(nice, spread, idle)
            lower_native_threads(nice, spread, idle)
        self.executor.start()
        self._sender.start()
        self._thread = threading.Thread(
            target=as_host(self._run), name=f"pw-host-{self.name}", daemon=True
        )
        self._thread.start()
        self._to_controller(
            {
                "t": "register",
                "host": self.name,
                "island": self.island,
                "devices": [int(d.id) for d in self.devices],
                "data_address": self.data_address,
                "versions": self._versions.to_dict(),
                "process": f"{socket.gethostname()}:{os.getpid()}",
                "platform": self.devices[0].platform if self.devices else "none",
                "store_limit": self.store.limit,
            }
        )
        if not self._registered.wait(timeout):
            self.stop()
            raise BrokenError(
                f"host {self.name} got no answer from the controller at "
                f"{self._controller_address} within {timeout:.0f} s"
            )
        if self._refused is not None:
            reason = self._refused
            self.stop()
            raise VersionMismatchError(f"the controller refused host {self.name}: {reason}")
        return self

    def stop(self) -> None:
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._outbox.send(b"wake", None)
        self._thread.join()
        self.executor.stop()
        self._sender.stop()
        self.store.fail_waiters(
            lambda h: RemoteError(f"host {self.name} shut down", kind="data_loss", host=self.name)
        )
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ctl.close(0)
        self._data.close(0)
        self._outbox.close()
        if self._own_ctx:
            self._ctx.term()

    def statistics(self) -> tuple[StoreStatistics, ExecutorStatistics]:
        return self.store.statistics(), self.executor.statistics()

    # called from other threads ------------------------------------------------------
    def _to_controller(self, header: dict[str, Any]) -> None:
        # A stream to the controller takes sends from any thread (acknowledgements from
        # the completion thread, parking notes from the dispatch thread) without waking
        # the socket thread; a ZeroMQ socket (in-process) only from its owner.
        if self._direct_ctl or threading.get_ident() == self._loop_ident:
            self._ctl.send_multipart(encode(header), copy=False)
        else:
            self._outbox.send(_TO_CONTROLLER, encode(header))

    def _to_client(self, identity: bytes, header: dict[str, Any], bufs: Sequence[Any] = ()) -> None:
        # As for the controller: a stream takes an answer from the completion thread or
        # the fetch pool directly; a ZeroMQ socket only from the socket thread.
        if self._direct_data or threading.get_ident() == self._loop_ident:
            self._send_data(identity, encode(header, bufs))
        else:
            self._outbox.send(b"d" + identity, encode(header, bufs))

    def _send_data(self, identity: bytes, frames: Sequence[Any]) -> None:
        """Send to a client on the data plane (the socket thread, or any with a stream)."""
        try:
            self._data.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            # The client went away before its reply; nothing to deliver.

    # the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        self._loop_ident = threading.get_ident()
        self.executor.serve_inline_from_this_thread()
        poller = Poller()
        poller.register(self._ctl, zmq.POLLIN)
        poller.register(self._data, zmq.POLLIN)
        poller.register(self._outbox.socket, zmq.POLLIN)
        departed(self._data)  # from now on the router counts the peers that leave
        next_beat = time.monotonic() + _HEARTBEAT
        while not self._stopping.is_set():
            # What this thread dispatched and XLA finished is recorded here; the rest
            # goes to the completion thread as one run.
            self.executor.completions.reap()
            ready = dict(poller.poll(int(_HEARTBEAT * 1000)))
            if time.monotonic() >= next_beat:
                # Tells the controller this host still serves, where no cluster engine
                # reports deaths (or the process hangs without dying).
                beat = {"t": "heartbeat", "tenant_bytes": self.store.tenant_bytes()}
                self._ctl.send_multipart(encode(beat))
                next_beat = time.monotonic() + _HEARTBEAT
                for identity, h, _, exc in self._waiting_puts.expired(_PUT_NOTE_WAIT):
                    self._put_failed(identity, h, exc)
            if self._outbox.socket in ready:
                self._send_outbox()
            if self._ctl in ready:
                self._drain(self._ctl, self._on_controller)
            if self._data in ready:
                self._drain(self._data, self._on_data)
                for identity in departed(self._data):
                    self._peers.forget(identity)
                    self._profiles.departed(identity)

    def _drain(self, sock: AnySocket, handler: Any) -> None:
        for frames in receive(sock):
            try:
                handler(frames)
            except Exception:
                log.exception("host %s failed handling a message", self.name)
        self.executor.resume_due()
        if self._arrival_acks:
            items, self._arrival_acks = self._arrival_acks, []
            self._to_controller({"t": "acks", "items": items})

    def _send_outbox(self) -> None:
        for target, frames in self._outbox.drain():
            if target == _TO_CONTROLLER:
                self._ctl.send_multipart(frames, copy=False)
            elif target.startswith(b"d"):
                self._send_data(target[1:], frames)

    # controller messages ------------------------------------------------------------
    def _on_controller(self, frames: list[Any]) -> None:
        try:
            msg = decode(frames)
            kind = check(msg.header, _CONTROLLER_TYPES)
        except ProtocolError as exc:
            log.warning("host %s dropped a bad controller message: %s", self.name, exc)
            return
        h = msg.header
        if kind == "batch":
            # What the gang scheduler released at once, as run and drop headers.
            for sub in h["msgs"]:
                try:
                    if not isinstance(sub, dict):
                        raise ProtocolError("batch entries must be maps")
                    sk = check(sub, _BATCHED_TYPES)
                except ProtocolError as exc:
                    log.warning("host %s dropped a bad batched message: %s", self.name, exc)
                    continue
                if sk == "drop":
                    self.executor.submit("drop", sub["handles"])
                else:
                    self.executor.submit(sk, sub)
        elif kind == "welcome":
            quota = h.get("tenant_store_bytes")
            if type(quota) is int and quota >= 0:
                self.store.tenant_limit = quota
            try:
                early = self._peers.key(h.get("secret"))
                self._sender.token = self._peers.host_token()
            except ValueError as exc:
                self._refused = str(exc)
                early = []
            for identity, reply in early:
                self._send_data(identity, encode(reply))
            self._registered.set()
        elif kind == "refuse":
            self._refused = h["reason"]
            self._registered.set()
        elif kind == "error":
            log.warning("controller says: %s", h["message"])
        elif kind == "program":
            if len(msg.buffers) == 1:
                specs, options, types = h.get("in_specs"), h.get("options"), h.get("axis_types")
                self.executor.submit(
                    "program",
                    (
                        h["pid"],
                        h["name"],
                        bytes(msg.buffers[0]),
                        specs if isinstance(specs, list) else [],
                        options if isinstance(options, dict) else {},
                        types if isinstance(types, list) else [],
                        h.get("kind", "xla"),
                    ),
                )
        elif kind == "run":
            self.executor.submit("run", h)
        elif kind == "drop":
            self.executor.submit("drop", h["handles"])
        elif kind == "host_probe":  # answered off the island's queue (see _programs)
            self.executor.programs.probe_soon(h, self._to_controller)
        elif kind == "fault":
            self.executor.submit("fault", (h["match"], h["kind"], h["tenant"]))
        elif kind == "cancel_runs":
            # Not queued behind the work it cancels: it takes that work out of the queue.
            self.executor.cancel_runs(h["tenant"], h["message"])
        elif kind == "fail_outputs":
            self.executor.submit("fail_outputs", (h["handles"], h["error"]))
        elif kind == "forget_programs":
            self.executor.submit("forget", [p for p in h["pids"] if isinstance(p, str)])

    # data plane ---------------------------------------------------------------------
    def _on_data(self, frames: list[Any]) -> None:
        identity = peer_id(frames[0])
        try:
            msg = decode(frames[1:], self.config.max_data_message)
            kind = check(msg.header, _DATA_TYPES)
        except ProtocolError as exc:
            self._send_data(identity, encode(error_header(str(exc))))
            return
        h = msg.header
        if kind == "hello":
            reply = self._peers.hello(identity, h)
            if reply is not None:
                self._send_data(identity, encode(reply))
            return
        why = self._peers.refusal(identity, kind, h)
        if why is not None:
            self._send_data(identity, encode(error_header(why, h.get("rid"))))
            return
        if kind == "put":
            self._put(identity, h, msg.buffers)
        elif kind == "expect":
            if self.store.get(h["handle"]) is None:
                self.executor.fed.expect(h["handle"])
            self._send_data(identity, encode({"t": "reply", "rid": h["rid"]}))
        elif kind == "put_failed":
            # Only for a handle still expected: its expect came first on this same
            # connection, and no other array can be failed this way.
            if self.executor.fed.outstanding(h["handle"]):
                try:
                    err = RemoteError.from_dict(h["error"])
                except Exception as exc:
                    err = to_remote(exc, "invalid", program="put", slice="", host=self.name)
                self._store_fed(h["handle"], None, err)
            self._send_data(identity, encode({"t": "reply", "rid": h["rid"]}))
        elif kind == "xfer":
            try:
                self._assembler.piece(h, msg.buffers)
            except Exception as exc:
                self._assembler.forget(h["handle"])
                err = to_remote(exc, "invalid", program="transfer", slice="", host=self.name)
                self._arrived(h, None, err, 0)
        elif kind in ("fetch", "wait"):
            self._answers.one(identity, h["rid"], kind, h["handle"])
        elif kind in ("fetch_many", "wait_many"):
            self._answers.many(identity, h["rid"], kind, h["handles"])
        elif kind == "save":
            self._checkpoints.save(identity, h, self._peers.tenant(identity))
        elif kind == "commit_save":
            self._checkpoints.commit(identity, h, self._peers.tenant(identity))
        elif kind == "saved":
            self._checkpoints.saved(identity, h)
        elif kind == "load":
            self._checkpoints.load(identity, h)
        elif kind == "profile":
            self._profiles.request(identity, self._peers.tenant(identity), h)

    def _arrived(self, h: dict[str, Any], value: Any, err: RemoteError | None, nbytes: int) -> None:
        """A transfer into this host finished: store it, tell the controller."""
        handle = h["handle"]
        if self.store.get(handle) is not None:
            return  # already failed: the controller gave up on this transfer (source lost)
        if err is None:
            try:
                # The bytes are here already; past a limit they are let go of at once.
                self.store.reserve_check(nbytes, tenant=handle_owner(handle))
            except ResourceExhaustedError as exc:
                err = to_remote(
                    exc, "resource_exhausted", program="transfer", slice="", host=self.name
                )
                value = None
        if err is None:
            self.store.set(handle, value, nbytes, ("transfer", h["source"]), ready=True)
        else:
            self.store.fail(handle, err)
        self.executor.arrived(handle)
        info = {"bytes": nbytes, "source": h["source"]}
        item = [h["lid"], h["t0"], time.time(), err.to_dict() if err else None, info]
        if threading.get_ident() == self._loop_ident:
            # Told once this thread's messages are handled, after the launches waiting
            # for the array were dispatched: the controller needs it only to account.
            self._arrival_acks.append(item)
        else:
            self._to_controller({"t": "acks", "items": [item]})

    def _put(self, identity: bytes, h: dict[str, Any], bufs: list[Any]) -> None:
        rid = h["rid"]
        try:
            if len(bufs) != 1:
                raise ProtocolError("a put carries exactly one frame of array bytes")
            dtype = decode_dtype(h["dtype"])
            shape = tuple(int(n) for n in h["shape"])
            arr = np.frombuffer(bufs[0], dtype=dtype)
            if arr.size != int(np.prod(shape)):
                raise ProtocolError(
                    f"put of shape {shape} {dtype} needs {int(np.prod(shape)) * dtype.itemsize} "
                    f"bytes; got {len(bufs[0])}"
                )
            arr = arr.reshape(shape)
            if self._store_or_park(identity, h, arr):
                self._to_client(identity, {"t": "reply", "rid": rid})
        except Exception as exc:
            self._put_failed(identity, h, exc)

    def _store_or_park(self, identity: bytes | None, h: dict[str, Any], arr: np.ndarray) -> bool:
        """Store a put's value: True once stored, False if it waits for its note
        (``identity``: the client that sent its bytes; None for a value from Dask)."""
        try:
            self._store_put(h, arr)
        except ResourceExhaustedError as exc:
            # It may fit once the deletions sent before it are done (see _puts).
            if self._waiting_puts.park(h["handle"], (identity, h, arr, exc)):
                return False
            self._store_put(h, arr)  # they are done now
        self._waiting_puts.arrived(h["handle"])
        return True

    def _put_failed(
        self, identity: bytes | None, h: dict[str, Any], exc: Exception, program: str = "put"
    ) -> None:
        """The put's handle holds its error; the client that sent the bytes hears it
        (``identity`` None: Dask computed the value here, and who waits reads the store)."""
        err = to_remote(exc, "invalid", program=program, slice="", host=self.name)
        self.store.fail(h["handle"], err)
        if identity is not None:
            self._to_client(identity, {"t": "failed", "rid": h["rid"], "error": err.to_dict()})

    def _noted(self, handle: int) -> None:
        """The controller's note for a put (the executor calls this in the island's
        order): a put waiting for it is tried once more, now that every deletion sent
        before it is done."""
        if self.store.get(handle) is not None:
            return  # stored already
        # A put still on its way (its bytes, or its value from a Dask task here) finds
        # the note remembered.
        put = self._waiting_puts.noted(handle)
        if put is None:
            return
        identity, h, arr, _ = put
        try:
            self._store_put(h, arr)
        except Exception as exc:
            self._put_failed(identity, h, exc)
            return
        if identity is not None:
            self._to_client(identity, {"t": "reply", "rid": h["rid"]})

    def _store_put(self, h: dict[str, Any], arr: np.ndarray) -> None:
        """Lay a put's value out on its slice's devices and store it."""
        mesh = self.executor.programs.mesh(h["devices"], h["mesh"])
        sharding = placed_by(mesh, h) or NamedSharding(mesh, decode_spec(h["spec"]))
        self.store.reserve_check(arr.nbytes, tenant=handle_owner(int(h["handle"])))
        value = from_host(arr, sharding)
        impl = h.get("key_impl")
        if impl:
            value = jax.random.wrap_key_data(value, impl=impl)
        self.store.set(h["handle"], value, arr.nbytes, ("put", ""), ready=True)

    # puts computed by Dask in this process --------------------------------------------
    def store_fed(self, h: dict[str, Any], value: Any) -> None:
        """Store ``value``, which a Dask task in this worker process computed for a
        client's put of a Dask collection; ``h`` is the put's header (handle, shape,
        dtype, spec, devices, mesh). Safe from any thread. A value that does not match
        the header, or does not fit, is stored as the handle's error."""
        try:
            dtype = decode_dtype(h["dtype"])
            shape = tuple(int(n) for n in h["shape"])
            arr = np.asarray(value)
            if arr.shape != shape:
                raise ValueError(
                    f"the Dask collection computed to shape {arr.shape}, where its metadata "
                    f"said {shape}: the put expected the shape it was given"
                )
            arr = np.ascontiguousarray(arr.astype(dtype, copy=False))
        except Exception as exc:
            err = to_remote(exc, "invalid", program="put", slice="", host=self.name)
            self._store_fed(h["handle"], None, err)
            return
        self._store_fed(h["handle"], (h, arr), None)

    def _store_fed(
        self, handle: int, put: tuple[dict[str, Any], np.ndarray] | None, err: RemoteError | None
    ) -> None:
        if not self.executor.fed.arrive(handle):
            return  # the client let go of it while Dask computed it
        if put is not None:
            try:
                self._store_or_park(None, *put)
                return
            except Exception as exc:
                err = to_remote(exc, "invalid", program="put", slice="", host=self.name)
        if err is not None and self.store.get(handle) is None:
            self.store.fail(handle, err)
