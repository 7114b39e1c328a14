"""Puts of Dask arrays: computed on the Dask worker that runs the slice's host and
stored into that host's object store in the same process, never through this client.

``vs.put(x, spec)`` of a ``dask.array.Array`` returns a RemoteArray at once, as any put
does. The client names the handle, tells the host to expect it, and asks the Dask
scheduler to compute ``x`` on that one worker (inputs persisted elsewhere in the Dask
cluster move there, as Dask moves any task's inputs) and to hand the result to the host.
Programs that read the array wait on the host until it is stored, however long the
computation takes; if it fails, the array holds the error, with the Dask traceback, and
everything computed from it fails with that cause.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb._core import DataLossError, RemoteError, encode_dtype, encode_mesh, encode_spec
from pathways_nb.client._remote import RemoteArray
from pathways_nb.wire import interrupts_deferred

if TYPE_CHECKING:
    from pathways_nb._core import HandleAllocator
    from pathways_nb.client._io import IOThread
    from pathways_nb.client._session import Client
    from pathways_nb.client._slice import VirtualSlice


def is_dask_collection(value: Any) -> bool:
    """Whether ``value`` is a Dask collection (without importing Dask for anything else)."""
    if not type(value).__module__.startswith(("dask", "dask_expr")):
        return False
    import dask

    return bool(dask.is_dask_collection(value))


@dataclasses.dataclass
class _Fed:
    """A Dask put in flight: its Dask future (held, or Dask would forget the task),
    and whether the array was deleted before the value reached the host."""

    future: Any
    host: str
    data_address: str
    deleted: bool = False
    # Set when the host was lost: the task cannot finish (Dask keeps it for a worker of
    # that address, which a restarted worker does not have).
    lost: DataLossError | None = None


class DaskPuts:
    """The part of :class:`Client` that puts Dask arrays."""

    _ids: HandleAllocator
    _io: IOThread
    _cond: threading.Condition
    _pending: dict[int, list[int]]
    _errors: dict[int, RemoteError]
    _fed: dict[int, _Fed]
    _dask: Any
    _own_dask: bool
    # Hosts known to run in a worker of the Dask client's scheduler.
    _dask_hosts: set[str]
    scheduler_address: str | None
    security: Any

    if TYPE_CHECKING:  # provided by Client

        def _as_client(self) -> Client: ...

        def _put(self, vs: VirtualSlice, value: Any, spec: PartitionSpec | None) -> RemoteArray: ...

    @property
    def dask_client(self) -> Any:
        """The ``distributed.Client`` this client computes Dask puts with: the current
        default Dask client when it talks to this cluster's scheduler, else one made on
        first use (closed with this client). None for a cluster without Dask (an
        ``InProcessCluster``, or a client connected with ``controller=``)."""
        if self._dask is None and self.scheduler_address:
            from distributed import Client as DaskClient
            from distributed import default_client

            try:
                current = default_client()
            except ValueError:
                current = None
            if current is not None and current.scheduler.address == self.scheduler_address:
                self._dask, self._own_dask = current, False
            else:
                self._dask = DaskClient(
                    self.scheduler_address, set_as_default=False, security=self.security
                )
                self._own_dask = True
        return self._dask

    def _put_dask(self, vs: VirtualSlice, value: Any, spec: PartitionSpec) -> RemoteArray:
        shape, dtype = _array_meta(value)
        vs.check_spec(spec, shape)
        dask = self.dask_client
        if dask is None:
            # No Dask cluster holds this slice's host: compute here and send the bytes.
            return self._put(vs, value.compute(), spec)
        self._check_dask_worker(dask, vs)
        handle = self._ids.next()
        header: dict[str, Any] = {
            "handle": handle,
            "shape": list(shape),
            "dtype": encode_dtype(dtype),
            "spec": encode_spec(spec),
            "devices": vs.devices,
            "mesh": encode_mesh(vs.mesh_shape),
        }
        nbytes = int(np.prod(shape)) * dtype.itemsize
        # Deletions queued before the put leave ahead of its note, as for a put of bytes.
        self._io.deletes_now()
        self._io.send_batched({"t": "put_note", "handle": handle, "slice": vs.id, "nbytes": nbytes})
        self._io.host_request(vs.data_address, {"t": "expect", "handle": handle})
        from pathways_nb.deploy._tasks import store_on_host

        where = {"workers": [vs.host], "allow_other_workers": False}
        computed = dask.compute(value, **where)
        stored = dask.submit(
            store_on_host, computed, header, vs.host, key=f"pathways-put-{handle:x}", **where
        )
        # A negative launch id no launch has: the array is ready once Dask has stored it.
        lid = -handle
        with interrupts_deferred():  # waited for and watched, or neither
            self._pending[lid] = [handle]
            self._fed[handle] = _Fed(stored, vs.host, vs.data_address)
            stored.add_done_callback(lambda f: self._dask_put_done(handle, f))
            return self._put_array(vs, handle, shape, dtype, spec, lid)

    def _put_array(
        self,
        vs: VirtualSlice,
        handle: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        spec: PartitionSpec,
        lid: int,
    ) -> RemoteArray:
        """The RemoteArray of a put: ``handle`` on ``vs``, laid out by ``spec``."""
        sharding = NamedSharding(vs.abstract_mesh, spec)
        return RemoteArray(self._as_client(), handle, shape, dtype, sharding, vs, lid)

    def _check_dask_worker(self, dask: Any, vs: VirtualSlice) -> None:
        """Raise unless ``dask``'s scheduler has the worker running ``vs``'s host: a
        task pinned to a worker the scheduler lacks would wait for it for ever."""
        if vs.host in self._dask_hosts:
            return
        workers = dask.scheduler_info(n_workers=-1).get("workers", {})
        names = {str(w.get("name")) for w in workers.values()}
        if vs.host not in workers and vs.host not in names:
            raise ValueError(
                f"slice {vs.name!r} runs on host {vs.host}, which is no worker of the Dask "
                f"scheduler at {dask.scheduler.address} (its workers: "
                f"{sorted(workers) or 'none'}): puts of Dask arrays are computed by the "
                "Dask worker that runs the slice's host, so the Dask client must be one of "
                "this cluster's (pw.Client(..., dask_client=...))"
            )
        self._dask_hosts.add(vs.host)

    def _dask_put_done(self, handle: int, future: Any) -> None:
        """Dask's callback thread: the value is on the host, or never will be."""
        fed = self._fed.get(handle)
        if fed is None:
            return
        if fed.lost is not None:
            self._errors[handle] = fed.lost
        elif future.status != "finished":
            err = _dask_error(future, fed.host)
            self._errors[handle] = err
            # The task never stored anything (an input of it failed, or it was cancelled):
            # the host learns the cause, so what waits for the array fails with it.
            self._io.host_request(
                fed.data_address, {"t": "put_failed", "handle": handle, "error": err.to_dict()}
            )
        with self._cond:
            self._fed.pop(handle, None)
            self._pending.pop(-handle, None)
            self._cond.notify_all()
        if fed.deleted:
            self._io.delete_soon(handle)

    def _dask_host_lost(self, host: str) -> None:
        """The host of some Dask puts in flight was lost: their arrays went with it, and
        their tasks are cancelled (they would wait for that worker for ever)."""
        with self._cond:
            gone = [f for f in self._fed.values() if f.host == host]
        for fed in gone:
            fed.lost = DataLossError(
                f"host {host} was lost while Dask computed this array for it", host=host
            )
            fed.future.cancel()

    def _fed_landed(self, handles: Sequence[int]) -> None:
        """Their hosts answered for these arrays: the Dask puts among them are stored,
        whenever Dask's callback comes. A deletion of one is sent as any other, not held
        for that callback: a put after it must find it sent ahead of the put's note."""
        with self._cond:
            for handle in handles:
                if self._fed.pop(handle, None) is not None:
                    self._pending.pop(-handle, None)

    def _defer_delete(self, handle: int) -> bool:
        """Hold a deletion until the array's Dask task is over, so that the host drops
        the value after it came (True), instead of keeping one that came after."""
        with self._cond:
            fed = self._fed.get(handle)
            if fed is None:
                return False
            fed.deleted = True
            return True

    def _close_dask(self) -> None:
        dask, self._dask = self._dask, None
        if dask is not None and self._own_dask:
            dask.close()


def _array_meta(value: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and the dtype the hosts store for a Dask array; clear errors for other
    collections and for arrays whose shape Dask does not know yet."""
    import dask.array as da

    if not isinstance(value, da.Array):
        kind = type(value).__name__
        how = {
            "DataFrame": "df.to_dask_array(lengths=True) (of numeric columns)",
            "Series": "s.to_dask_array(lengths=True)",
            "Delayed": "dask.array.from_delayed(d, shape, dtype)",
            "Bag": "bag.to_dataframe().to_dask_array(lengths=True)",
        }.get(kind, "a dask.array.Array of it")
        raise TypeError(f"put takes a Dask array (dask.array.Array); got a Dask {kind}. Put {how}")
    if any(np.isnan(n) for n in value.shape):
        raise ValueError(
            f"this Dask array's shape is not known yet ({value.shape}): call "
            "x.compute_chunk_sizes() first (or give lengths= where it was made), so that "
            "the RemoteArray's shape is known before its value is"
        )
    from pathways_nb.client._arrays import put_dtype

    return tuple(int(n) for n in value.shape), put_dtype(np.dtype(value.dtype))


def _dask_error(future: Any, host: str) -> RemoteError:
    if future.status == "cancelled":
        return RemoteError(
            "the Dask computation of this array was cancelled before it reached the host",
            kind="cancelled",
            program="put",
            host=host,
        )
    exc = future.exception()
    tb = future.traceback()
    text = "".join(traceback.format_exception(type(exc), exc, tb)) if tb is not None else ""
    if isinstance(exc, RemoteError):
        return exc
    return RemoteError(
        f"the Dask computation of this array failed: {type(exc).__name__}: {exc}",
        kind="dask",
        program="put",
        host=host,
        remote_traceback=text,
    )
