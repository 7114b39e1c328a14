"""One IFRT proxy session: a JAX process's arrays and executables, as a tenant.

Each session is a :class:`pathways_nb.Client` of its own (its name, weight, quotas,
lease and event log are a tenant's), holding one virtual slice per island. IFRT device
``i`` is a virtual device of those slices; the resource manager maps it onto a
physical device, and remaps it when a host dies. Arrays are RemoteArrays laid out as
the JAX client asked (an ``OpSharding`` over some of a slice's devices), and programs
are the StableHLO modules ``jax.jit`` lowered, compiled and run by the island's host in
its gang scheduler's order.

Requests are handled in the order they arrive, on the session's own thread; those that
wait for values (reads, readiness, futures) are answered from a pool when the values are
there, so later requests are not held behind them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_nb._core import RemoteError
from pathways_nb.proxy import _status
from pathways_nb.proxy._buffers import HostBuffers
from pathways_nb.proxy._layouts import (
    Layout,
    dtype_of,
    layout_of,
    shape_of,
)
from pathways_nb.proxy._protos import message
from pathways_nb.proxy._status import ProxyError, unimplemented

log = logging.getLogger("pathways_nb.proxy")

# Handles the server makes start here: the client's own count up from 1.
SERVER_HANDLES = 1 << 63
# How long a request waits for the bytes of its host buffer.
HOST_BUFFER_WAIT = 600.0

Handler = Callable[["Session", Any, Any], Any]


@dataclasses.dataclass
class Entry:
    """An array of the session: its RemoteArray (None once deleted, or for an error
    array), shape, dtype, layout and island (index among the session's slices);
    ``error`` for an array that failed."""

    remote: Any
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    layout: Layout
    island: int
    error: BaseException | None = None
    deleted: bool = False
    # One device of a replicated array held over several: its RemoteArray is that
    # array's, laid out over them all, so a program on the one device takes a copy.
    view: bool = False


class Session:
    """The state of one IFRT session and its handlers, one per request type.

    ``backend`` is the :class:`~pathways_nb.proxy._cluster.ClusterBackend` that speaks
    to the cluster for it."""

    def __init__(
        self, session_id: int, factory: Callable[[dict[str, Any]], Any], init: dict[str, Any]
    ) -> None:
        self.id = session_id
        self._factory = factory
        self._init_data = init
        self.backend: Any = None
        self.buffers = HostBuffers()
        self.arrays: dict[int, Entry] = {}
        # How many entries hold each RemoteArray (by id; a held one stays alive).
        self._holders: collections.Counter[int] = collections.Counter()
        self.executables: dict[int, Any] = {}
        self.futures: dict[int, concurrent.futures.Future[None]] = {}
        self._handles = itertools.count(SERVER_HANDLES)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            8, thread_name_prefix=f"pw-proxy-{session_id}"
        )
        self.closed = False

    # -- the loop's side ------------------------------------------------------------------
    def handle(self, req: Any) -> Any:
        """The response to ``req``, or a Future of it for a request that waits."""
        kind = req.WhichOneof("request")
        resp = message("xla.ifrt.proxy.IfrtResponse")()
        resp.response_metadata.op_id = req.request_metadata.op_id
        fn = _HANDLERS.get(kind or "")
        try:
            if self.backend is None and kind != "init_request":
                raise ProxyError(
                    _status.FAILED_PRECONDITION, f"{kind} before the session's init_request"
                )
            if fn is None:
                raise unimplemented(f"request {kind or '(empty)'}")
            body = getattr(resp, kind.replace("_request", "_response"))
            body.SetInParent()
            out = fn(self, getattr(req, kind), body)
        except Exception as exc:
            if kind is not None and kind in _MAKES:
                # The client does not wait for these: whoever reads their results hears
                # why they failed.
                self.store_errors(
                    [h for h in _made(getattr(req, kind), kind) if h not in self.arrays], exc
                )
            return _failed(resp, exc, kind)
        if isinstance(out, concurrent.futures.Future):
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()

            def answered(f: concurrent.futures.Future[Any]) -> None:
                exc = f.exception()
                done.set_result(_failed(resp, exc, kind) if exc is not None else resp)

            out.add_done_callback(answered)
            return done
        return resp

    def later(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        return self._pool.submit(fn)

    def new_handle(self) -> int:
        return next(self._handles)

    def close(self) -> None:
        """End the session: its arrays and executables go, its slices are released."""
        if self.closed:
            return
        self.closed = True
        self.buffers.close()
        self.arrays.clear()
        self.executables.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.backend is not None:
            self.backend.close()

    # -- arrays -----------------------------------------------------------------------
    def entry(self, handle: int) -> Entry:
        e = self.arrays.get(handle)
        if e is None:
            raise ProxyError(_status.NOT_FOUND, f"unknown array handle {handle}")
        if e.error is not None:
            raise e.error
        if e.deleted or e.remote is None:
            raise ProxyError(_status.INVALID_ARGUMENT, f"array {handle} was deleted")
        return e

    def store(self, handle: int, entry: Entry) -> None:
        if handle == 0:
            raise ProxyError(_status.INVALID_ARGUMENT, "array handle 0 is not a handle")
        old = self.arrays.get(handle)
        if old is not None:
            self.drop(old)
        self.arrays[handle] = entry
        if entry.remote is not None:
            self._holders[id(entry.remote)] += 1

    def drop(self, e: Entry) -> None:
        """``e`` is deleted: it lets go of its RemoteArray, which the host deletes once
        no other entry holds it (a view of it, a copy onto the same layout)."""
        e.deleted = True
        remote, e.remote = e.remote, None
        if remote is not None:
            key = id(remote)
            self._holders[key] -= 1
            if self._holders[key] <= 0:
                del self._holders[key]

    def shared(self, e: Entry) -> bool:
        """Whether another entry holds ``e``'s RemoteArray."""
        return e.remote is not None and self._holders.get(id(e.remote), 0) > 1

    def store_errors(self, handles: Any, exc: BaseException) -> None:
        """Later uses of these handles raise ``exc``: a request the client did not wait
        for failed, and whoever reads its results hears why."""
        for h in handles:
            if h:
                self.arrays[h] = Entry(None, (), np.dtype(np.float32), Layout(()), -1, exc)

    def done_future(self) -> int:
        """The handle of a future already done, for the client to redeem."""
        handle = self.new_handle()
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        fut.set_result(None)
        self.futures[handle] = fut
        return handle


# The requests that make arrays under handles the client chose.
_MAKES = frozenset(
    {
        "make_array_from_host_buffer_request",
        "make_arrays_from_host_buffer_shards_request",
        "assemble_array_from_single_device_arrays_request",
        "remap_arrays_request",
        "bitcast_arrays_request",
        "reshard_arrays_request",
        "disassemble_into_single_device_arrays_request",
        "copy_arrays_request",
        "fully_replicated_shard_request",
        "loaded_executable_execute_request",
    }
)


def _made(req: Any, kind: str) -> list[int]:
    """The handles a request of ``kind`` makes arrays under."""
    out: list[int] = []
    for field in ("result_handles", "result_handle", "result_array_handle"):
        if field in req.DESCRIPTOR.fields_by_name:
            value = getattr(req, field)
            out.extend([value] if isinstance(value, int) else list(value))
    if kind == "make_array_from_host_buffer_request":
        out.append(req.array_handle or req.host_buffer_handle)
    elif kind == "make_arrays_from_host_buffer_shards_request":
        out.extend(req.array_handles)
    return [h for h in out if h]


def _failed(resp: Any, exc: BaseException, kind: str | None) -> Any:
    if kind:
        resp.ClearField(kind.replace("_request", "_response"))
    _status.fill(resp.response_metadata.status, exc)
    if not isinstance(exc, ProxyError | RemoteError):
        log.warning("%s failed: %s", kind, _status.message_of(exc))
    return resp


# -- handlers ----------------------------------------------------------------------------
def _init(s: Session, req: Any, body: Any) -> None:
    if s.backend is not None:
        raise ProxyError(_status.FAILED_PRECONDITION, "the session was initialized already")
    try:
        s.backend = s._factory(s._init_data)
    except Exception as exc:
        raise ProxyError(
            _status.UNAVAILABLE, f"pathways_nb could not start the session: {exc}"
        ) from None
    s.backend.describe(s.id, body)


def _make_array(s: Session, req: Any, body: Any) -> None:
    handle = req.array_handle if req.HasField("array_handle") else req.host_buffer_handle
    data = s.buffers.take(req.host_buffer_handle, HOST_BUFFER_WAIT)
    dtype, shape = dtype_of(req.dtype), shape_of(req.shape)
    strides = list(req.byte_strides.strides) if req.HasField("byte_strides") else None
    value = _from_bytes(data, dtype, shape, strides)
    s.store(handle, s.backend.put(value, layout_of(req.sharding)))
    body.array_handle = handle


def _make_arrays_from_shards(s: Session, req: Any, body: Any) -> None:
    handles = list(req.array_handles)
    for i, spec in enumerate(req.specs):
        handle = handles[i] if i < len(handles) else spec.host_buffers[0].host_buffer_handle
        aspec = spec.array_spec
        dtype, shape = dtype_of(aspec.dtype), shape_of(aspec.shape)
        layout = layout_of(aspec.sharding)
        if len(spec.addressable_shard_indices) != len(spec.host_buffers):
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"{len(spec.host_buffers)} host buffers for "
                f"{len(spec.addressable_shard_indices)} lists of shard indices",
            )
        regions = s.backend.regions(layout, shape)
        value = np.zeros(shape, dtype)
        for indices, hb in zip(spec.addressable_shard_indices, spec.host_buffers, strict=True):
            data = s.buffers.take(hb.host_buffer_handle, HOST_BUFFER_WAIT)
            strides = list(hb.byte_strides.strides) if hb.HasField("byte_strides") else None
            part = _from_bytes(data, dtype_of(hb.dtype), shape_of(hb.shape), strides)
            for k in indices.indices:
                if not 0 <= k < len(regions):
                    raise ProxyError(
                        _status.INVALID_ARGUMENT,
                        f"shard index {k} of an array over {len(regions)} devices",
                    )
                value[regions[k]] = part
        s.store(handle, s.backend.put(value, layout))
        body.array_handles.append(handle)


def _make_error_arrays(s: Session, req: Any, body: Any) -> None:
    exc = ProxyError(req.error.code or _status.INTERNAL, req.error.message)
    for h, spec in zip(req.array_handles, req.array_specs, strict=False):
        s.arrays[h] = Entry(
            None,
            shape_of(spec.shape),
            dtype_of(spec.dtype),
            layout_of(spec.sharding),
            -1,
            exc,
        )
        body.array_handles.append(h)


def _fully_replicated_shard(s: Session, req: Any, body: Any) -> None:
    e = s.entry(req.array_handle)
    if not e.layout.replicated:
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"array {req.array_handle} is sharded; only a replicated array has one "
            "shard holding all of it",
        )
    s.store(req.result_handle, s.backend.single(e, e.layout.devices[0]))
    body.array_handle = req.result_handle


def _copy_to_host(s: Session, req: Any, body: Any) -> None:
    """Answered at once: the client's lookup of the host buffer waits for the bytes,
    or hears why they could not be read."""
    # Its own entry: the array stays alive for the read if the client drops it first.
    e = dataclasses.replace(s.entry(req.array_handle))
    strides = list(req.byte_strides.strides) if req.HasField("byte_strides") else None
    handle = req.host_buffer_handle
    s.buffers.expect(handle)

    def copy() -> None:
        try:
            s.buffers.put(handle, _to_bytes(s.backend.fetch(e), strides))
        except BaseException as exc:
            s.buffers.fail(handle, exc)

    s.later(copy)


def _check_value_ready(s: Session, req: Any, body: Any) -> concurrent.futures.Future[None]:
    entries = [s.entry(h) for h in req.value_handles]
    return s.later(lambda: s.backend.wait(entries))


def _check_future(s: Session, req: Any, body: Any) -> concurrent.futures.Future[None]:
    fut = s.futures.pop(req.future_handle, None)
    if fut is None:
        raise ProxyError(_status.NOT_FOUND, f"unknown future handle {req.future_handle}")
    return fut


def _delete_array(s: Session, req: Any, body: Any) -> None:
    for h in req.array_handle:
        e = s.arrays.get(h)
        if e is not None and not e.deleted:
            s.drop(e)
    body.deletion_future_handle = s.done_future()


def _destruct_array(s: Session, req: Any, body: Any) -> None:
    for h in req.array_handle:
        e = s.arrays.pop(h, None)
        if e is not None:
            s.drop(e)


def _is_array_deleted(s: Session, req: Any, body: Any) -> None:
    e = s.arrays.get(req.array_handle)
    if e is None:
        raise ProxyError(_status.NOT_FOUND, f"unknown array handle {req.array_handle}")
    body.deleted = e.deleted or (e.remote is not None and e.remote.is_deleted())


def _moved(
    s: Session, handles: list[int], results: list[int], layouts: list[Layout], donate: bool
) -> list[int]:
    """The arrays at ``handles`` laid out anew as ``layouts``, under ``results``."""
    for h, r, layout in zip(handles, results, layouts, strict=True):
        e = s.entry(h)
        s.store(r, s.backend.relayout(e, layout))
        if donate:
            s.drop(e)
    return results


# ArrayCopySemantics.ARRAY_COPY_SEMANTICS_DONATE_INPUT: the inputs go with the request.
_DONATE_INPUT = 3


def donates(semantics: int) -> bool:
    """Whether a request's ``ArrayCopySemantics`` give its inputs up."""
    return int(semantics) == _DONATE_INPUT


def _copy_arrays(s: Session, req: Any, body: Any) -> None:
    handles, results = list(req.array_handles), list(req.result_handles)
    devices = tuple(req.device_ids)
    kind = req.memory_kind if req.HasField("memory_kind") and req.memory_kind else "device"
    layouts = []
    for h in handles:
        e = s.arrays.get(h)
        if e is not None and len(devices) != len(e.layout.devices):
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"copying array {h} of {len(e.layout.devices)} devices onto {len(devices)}",
            )
        op = e.layout.op if e is not None else b""
        layouts.append(Layout(devices, op, kind))
    body.array_handles.extend(_moved(s, handles, results, layouts, donates(req.copy_semantics)))


def _reshard_arrays(s: Session, req: Any, body: Any) -> None:
    layouts = [layout_of(spec.sharding) for spec in req.array_specs]
    body.array_handles.extend(
        _moved(
            s,
            list(req.array_handles),
            list(req.result_handles),
            layouts,
            donates(req.copy_semantics),
        )
    )


def _disassemble(s: Session, req: Any, body: Any) -> None:
    results = list(req.result_handles)
    e = s.entry(req.array_handle)
    parts = s.backend.disassemble(e)
    if len(parts) != len(results):
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"array {req.array_handle} has {len(parts)} shards; the request names "
            f"{len(results)} result handles",
        )
    for r, part in zip(results, parts, strict=True):
        s.store(r, part)
    if donates(req.copy_semantics):
        s.drop(e)
    body.array_handles.extend(results)


def _assemble(s: Session, req: Any, body: Any) -> None:
    parts = [s.entry(h) for h in req.single_device_array_handles]
    layout = layout_of(req.sharding)
    s.store(req.result_handle, s.backend.assemble(parts, shape_of(req.shape), layout))
    if donates(req.copy_semantics):
        for p in parts:
            s.drop(p)
    body.array_handle = req.result_handle


def _default_device_assignment(s: Session, req: Any, body: Any) -> None:
    n = int(req.num_replicas) * int(req.num_partitions)
    ids = s.backend.default_devices(n)
    da = body.device_assignment
    da.replica_count = int(req.num_replicas)
    da.computation_count = int(req.num_partitions)
    for c in range(int(req.num_partitions)):
        comp = da.computation_devices.add()
        for r in range(int(req.num_replicas)):
            comp.replica_device_ids.append(ids[r * int(req.num_partitions) + c])


def _default_layout(s: Session, req: Any, body: Any) -> None:
    n = len(req.dims)
    body.serialized_pjrt_layout = (
        "{" + ",".join(str(i) for i in range(n - 1, -1, -1)) + "}"
    ).encode()


def _from_bytes(
    data: bytes, dtype: np.dtype[Any], shape: tuple[int, ...], strides: list[int] | None
) -> np.ndarray:
    """The array a host buffer holds: C-ordered, or laid out by ``strides`` (bytes)."""
    size = int(np.prod(shape)) * dtype.itemsize
    if strides is None or list(strides) == _c_strides(shape, dtype.itemsize):
        if len(data) != size:
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"a {shape} {dtype} array needs {size} bytes; its host buffer has {len(data)}",
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if len(strides) != len(shape) or any(s < 0 for s in strides):
        raise ProxyError(_status.INVALID_ARGUMENT, f"byte strides {strides} for shape {shape}")
    need = sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) + dtype.itemsize
    need = need if size else 0
    if len(data) < need:
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"byte strides {strides} of a {shape} {dtype} array reach {need} bytes; the "
            f"host buffer has {len(data)}",
        )
    return np.array(np.ndarray(shape, dtype, buffer=data, strides=strides), copy=True)


def _to_bytes(value: np.ndarray, strides: list[int] | None) -> bytes:
    value = np.asarray(value)
    if strides is None or list(strides) == _c_strides(value.shape, value.dtype.itemsize):
        return np.ascontiguousarray(value).tobytes() if value.ndim else value.tobytes()
    if len(strides) != value.ndim or any(s < 0 for s in strides):
        raise ProxyError(
            _status.INVALID_ARGUMENT, f"byte strides {strides} for shape {value.shape}"
        )
    need = sum((n - 1) * st for n, st in zip(value.shape, strides, strict=True)) + value.itemsize
    out = bytearray(need if value.size else 0)
    if value.size:
        np.ndarray(value.shape, value.dtype, buffer=out, strides=strides)[...] = value
    return bytes(out)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> list[int]:
    out = []
    step = itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(1, n)
    return list(reversed(out))


_HANDLERS: dict[str, Handler] = {
    "init_request": _init,
    "make_array_from_host_buffer_request": _make_array,
    "make_arrays_from_host_buffer_shards_request": _make_arrays_from_shards,
    "make_error_arrays_request": _make_error_arrays,
    "fully_replicated_shard_request": _fully_replicated_shard,
    "copy_to_host_buffer_request": _copy_to_host,
    "check_value_ready_request": _check_value_ready,
    "check_future_request": _check_future,
    "delete_array_request": _delete_array,
    "destruct_array_request": _destruct_array,
    "is_array_deleted_request": _is_array_deleted,
    "copy_arrays_request": _copy_arrays,
    "reshard_arrays_request": _reshard_arrays,
    "disassemble_into_single_device_arrays_request": _disassemble,
    "assemble_array_from_single_device_arrays_request": _assemble,
    "get_default_device_assignment_request": _default_device_assignment,
    "get_default_layout_request": _default_layout,
}


def register(name: str, fn: Handler) -> None:
    """Add the handler of a request type (the executables' module adds its own)."""
    _HANDLERS[name] = fn
