"""The part of :class:`~pathways_nb.client.Client` that moves arrays: puts, fetches and
waits, straight between the client and the owning hosts (never through the
controller), and puts of arrays already on a slice, host to host."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pathways_nb._core import (
    CHECK_FROM,
    ProtocolError,
    RemoteError,
    as_bytes,
    check_fits,
    decode_dtype,
    encode_dtype,
    encode_mesh,
    encode_spec,
)
from pathways_nb.client import _graph
from pathways_nb.client._dask import DaskPuts, is_dask_collection
from pathways_nb.client._direct import DirectChannels, RequestFailed
from pathways_nb.client._jit import _is_remote, jit
from pathways_nb.client._prefetch import Prefetcher
from pathways_nb.client._programs import ProgramCalls
from pathways_nb.client._remote import RemoteArray

if TYPE_CHECKING:
    from pathways_nb.client._slice import VirtualSlice

# The launch id of a put: it is made by no program.
_LOCAL_LID = 0
# Arrays one fetch_many or wait_many names at most (the hosts' limit).
_MANY = 512


def put_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a put of ``dtype`` stores (as ``jax.device_put``: without x64, 64-bit
    types become their 32-bit kin; in the host's byte order); a clear error for what a
    host cannot hold."""
    if dtype == jax.dtypes.float0:
        raise TypeError(
            "put does not take float0 arrays: the gradient of an integer input holds "
            "no values (pw.jit returns it as a NumPy float0 array, as jax.jit does). "
            "Leave it out, or take gradients of float inputs only"
        )
    if not (jax.numpy.issubdtype(dtype, jax.numpy.number) or dtype == np.bool_):
        raise TypeError(
            f"put takes numeric or boolean arrays (bfloat16 and the other JAX "
            f"types included); got dtype {dtype}"
        )
    if jax.dtypes.itemsize_bits(dtype) < 8:
        raise TypeError(
            f"put does not take sub-byte dtypes such as {dtype}: a program "
            "exported for the hosts cannot take them as arguments. Put the values "
            "as int8 (or uint8) and convert inside the program."
        )
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype.newbyteorder("=")))


class ArrayIO(DaskPuts, ProgramCalls):
    """Puts, fetches and waits of a client's arrays."""

    _direct: DirectChannels
    _errors: dict[int, RemoteError]
    # Handle -> the host's answer to "is it computed?", while it is outstanding.
    _asked: dict[int, Future[Any]]
    _asked_lock: threading.Lock
    _prefetcher: Prefetcher

    def _put(self, vs: VirtualSlice, value: Any, spec: PartitionSpec | None) -> RemoteArray:
        self._check_open()
        vs._ready_for_work()
        spec = PartitionSpec() if spec is None else spec
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"put takes a PartitionSpec over the slice's axes; got {spec!r}")
        rec = _graph.active()
        if isinstance(value, RemoteArray):
            return self._put_remote(vs, value, spec, rec)
        if rec is not None and rec.tracing:
            # pw.graph traces shapes: nothing is sent.
            return _weak_if_scalar(value, rec.put(vs, value, spec))
        if is_dask_collection(value):
            return self._put_dask(vs, value, spec)
        header: dict[str, Any] = {}
        dtype: Any
        if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            header["key_impl"] = str(jax.random.key_impl(value))
            dtype = value.dtype
            shape = value.shape
            data = np.asarray(jax.random.key_data(value), order="C")
        else:
            if isinstance(value, np.ma.MaskedArray):
                raise ValueError(
                    "put does not take NumPy masked arrays (its mask would be dropped); "
                    "pass value.filled(fill_value), and the mask as an array of its own"
                )
            # A view where it can be, so that its size is checked before anything is copied.
            try:
                data = np.asarray(value)
            except ValueError as exc:
                raise TypeError(
                    f"put takes an array-like (what np.asarray reads as one array); "
                    f"{type(value).__name__} {_short(value)} is not one: {exc}. A list or "
                    "tuple of arrays is read as one array, as np.asarray reads it; several "
                    "arrays go as a dict (or a named tuple) of them, each leaf put as its "
                    "own RemoteArray"
                ) from None
            self._check_put_fits(vs, data.nbytes)
            data = np.asarray(data, order="C")
            canonical = put_dtype(data.dtype)
            if not data.dtype.isnative:
                # Hosts read arrays in their own byte order (big-endian data from a file).
                data = data.astype(data.dtype.newbyteorder("="))
            if canonical != data.dtype:
                if data.dtype.kind in "iu" and not isinstance(value, np.ndarray | np.generic):
                    _check_python_ints(value, data, canonical)
                data = data.astype(canonical)
            dtype, shape = data.dtype, data.shape
        vs.check_spec(spec, shape)
        handle = self._send_put(vs, data, spec, header)
        return _weak_if_scalar(value, self._put_array(vs, handle, shape, dtype, spec, _LOCAL_LID))

    def _send_put(
        self, vs: VirtualSlice, data: np.ndarray, spec: PartitionSpec, header: dict[str, Any]
    ) -> int:
        """Send ``data`` (C-ordered, of a dtype hosts take) to ``vs``'s host, laid out by
        ``spec`` (or what ``header`` adds); the new array's handle."""
        handle = self._ids.next()
        header.update(
            {
                "t": "put",
                "handle": handle,
                "shape": list(data.shape),
                "dtype": encode_dtype(data.dtype),
                "spec": encode_spec(spec),
                "devices": vs.devices,
                "mesh": encode_mesh(vs.mesh_shape),
            }
        )
        self._io.deletes_now()
        self._io.send_batched(
            {"t": "put_note", "handle": handle, "slice": vs.id, "nbytes": data.nbytes}
        )
        fut = self._io.host_request(vs.data_address, header, [as_bytes(data)])
        fut.add_done_callback(lambda f: self._put_done(f, handle))
        return handle

    def _put_hlo(
        self, vs: VirtualSlice, data: np.ndarray, op_sharding: bytes, positions: list[int]
    ) -> RemoteArray:
        """A put laid out as XLA's ``OpSharding`` (serialized) says, over ``vs``'s
        devices at ``positions``: how plain JAX's arrays arrive through the IFRT proxy.
        The RemoteArray's own sharding says nothing of that layout; its owner keeps it."""
        self._check_open()
        vs._ready_for_work()
        self._check_put_fits(vs, data.nbytes)
        data = np.asarray(data, order="C")
        header: dict[str, Any] = {"hlo_sharding": {"op": op_sharding, "positions": positions}}
        handle = self._send_put(vs, data, PartitionSpec(), header)
        return self._put_array(vs, handle, data.shape, data.dtype, PartitionSpec(), _LOCAL_LID)

    def _prefetch(self, x: RemoteArray) -> Any:
        self._check_open()
        return self._prefetcher.submit(x)

    def _put_remote(
        self,
        vs: VirtualSlice,
        x: RemoteArray,
        spec: PartitionSpec,
        rec: _graph.Recorder | None = None,
    ) -> RemoteArray:
        """``vs.put(x, spec)`` of an array already on a slice, as ``jax.device_put`` of a
        ``jax.Array``: a new array laid out by ``spec``, moved host to host (or, on x's
        own slice, resharded there), never through this client. A step being traced or
        recorded (``rec``) gets the move as a transfer edge of its dataflow graph."""
        x._check_usable()
        vs.check_spec(spec, x.shape)
        if x.slice is vs:
            key = ("put", vs.id, spec)
            f = self._ops.get(key)
            if f is None:
                f = self._ops[key] = jit(
                    _same, slice=vs, name="put", in_shardings=None, out_shardings=spec
                )
            return cast(RemoteArray, f(x))
        self._check_movable(x)
        if rec is not None and rec.tracing:
            return rec.move(x, vs, spec)
        copy = self._move(x, vs, spec, cached=False)
        if rec is not None:
            rec.moved(x, copy, copy._lid)
        return copy

    def _fetch_one(self, x: RemoteArray) -> Any:
        return self._fetch_values([x])[0]

    @staticmethod
    def _check_put_fits(vs: VirtualSlice, nbytes: int) -> None:
        check_fits(
            nbytes,
            f"putting a {nbytes / 2**30:.2f} GiB array on slice {vs.name!r}, whose host "
            "runs on this machine and keeps its own copy,",
            "Put it in parts (a batch at a time) and join them on the slice in a program "
            "(jnp.concatenate), or free memory on this machine first",
            to=vs.data_address,
        )

    def _put_done(self, fut: Any, handle: int) -> None:
        exc = fut.exception()
        if isinstance(exc, RemoteError):
            self._errors[handle] = exc

    def fetch(self, tree: Any) -> Any:
        """Values of every RemoteArray in ``tree`` (any pytree), as NumPy arrays.

        They are read-only, as ``np.asarray`` of a ``jax.Array`` is (each one is a view
        of the bytes that arrived, not a copy): ``np.array(x)`` gives one to change.
        """
        leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_remote)
        remote = [x for x in leaves if isinstance(x, RemoteArray) and x._host is None]
        values = iter(self._fetch_values(remote))
        out = []
        for leaf in leaves:
            if not isinstance(leaf, RemoteArray):
                out.append(leaf)
            elif leaf._host is not None:  # fetched (or being fetched) in the background
                leaf._check_usable()
                out.append(leaf._host.result())
            else:
                out.append(next(values))
        return jax.tree.unflatten(treedef, out)

    def block_until_ready(self, tree: Any) -> Any:
        """Wait until every RemoteArray in ``tree`` (any pytree) is computed; return
        ``tree``, as ``jax.block_until_ready`` does. Raises the error of one that failed.

        One request per host however many arrays the tree holds, where calling each
        leaf's ``block_until_ready`` costs a round trip per leaf.
        """
        leaves = jax.tree.leaves(tree, is_leaf=_is_remote)
        self._wait_ready([x for x in leaves if isinstance(x, RemoteArray)])
        return tree

    def _fetch_values(self, remote: Sequence[RemoteArray]) -> list[Any]:
        """The values of ``remote``, asked of their hosts now."""
        need = sum(x.nbytes for x in remote)
        if need >= CHECK_FROM:
            # Its message is written only where the check can fail: a small read's
            # round trip does not pay for the repr.
            check_fits(
                need,
                f"fetching {len(remote)} array{'s' if len(remote) > 1 else ''} (the largest "
                f"{max(remote, key=lambda x: x.nbytes)!r})",
                "Fetch a part of it (x[:1000]), reduce it on its slice first "
                "(x.mean(axis=0)), or keep it remote and pass it to the next program",
            )
        out = []
        for h, bufs in self._request(remote, "fetch"):
            shape, dtype = tuple(h["shape"]), decode_dtype(h["dtype"])
            arr = (
                np.frombuffer(bufs[0], dtype=dtype).reshape(shape)
                if bufs
                else np.zeros(shape, dtype)
            )
            arr.flags.writeable = False
            if h.get("key_impl"):
                out.append(jax.random.wrap_key_data(jax.numpy.asarray(arr), impl=h["key_impl"]))
            else:
                out.append(arr)
        return out

    def _request(self, xs: Sequence[RemoteArray], kind: str) -> list[Any]:
        """Ask the owning hosts directly for ``kind`` ("fetch" or "wait") of each array."""
        self._check_open()
        for x in xs:
            x._check_usable()
            if x._client is not self:
                raise ValueError("this RemoteArray belongs to another client")
            err = self._error_of(x)
            if err is not None:
                raise err
            x.slice.check_active()
        if not xs:
            return []

        def check() -> None:
            self._check_open()
            for x in xs:
                # A host lost meanwhile answers nothing: its slice reads lost, or has
                # already been remapped (the array went with the host), or the failure
                # of the program that made the array has arrived.
                x._check_usable()
                x.slice.check_active()
                err = self._error_of(x)
                if err is not None:
                    raise err

        # One request per host for all of its arrays (in parts of at most _MANY): one
        # message and one answer each way, however many leaves a pytree has.
        by_host: dict[str, list[int]] = {}
        for i, x in enumerate(xs):
            by_host.setdefault(x.slice.data_address, []).append(i)
        requests: list[tuple[str, dict[str, Any]]] = []
        members: list[list[int]] = []
        for address, idx in by_host.items():
            for at in range(0, len(idx), _MANY):
                part = idx[at : at + _MANY]
                members.append(part)
                if len(part) == 1:
                    requests.append((address, {"t": kind, "handle": xs[part[0]].handle}))
                else:
                    handles = [xs[i].handle for i in part]
                    requests.append((address, {"t": f"{kind}_many", "handles": handles}))
        try:
            replies = self._direct.request(requests, check)
        except KeyboardInterrupt:
            self.cancel()
            raise
        except RequestFailed as failed:
            # Known failed from now on, before the controller's (batched) notice says so:
            # its repr reads failed and the next read raises without asking the host.
            part = members[failed.index]
            x = xs[part[failed.item] if 0 <= failed.item < len(part) else part[0]]
            self._errors[x.handle] = failed.error
            x._ready = True
            raise failed.error from None
        # These arrays are computed: is_ready() need not wait for the controller's
        # (batched) completion notice to say so.
        for x in xs:
            x._ready = True
        if self._fed:
            self._fed_landed([x.handle for x in xs])
        out: list[Any] = [None] * len(xs)
        for part, (h, bufs) in zip(members, replies, strict=True):
            if h["t"] != "arrays":
                for i in part:
                    out[i] = (h, bufs)
                continue
            if not (len(h["shapes"]) == len(h["dtypes"]) == len(bufs) == len(part)):
                raise ProtocolError(
                    f"host at {xs[part[0]].slice.data_address} answered a fetch of "
                    f"{len(part)} arrays with {len(bufs)}"
                )
            for k, i in enumerate(part):
                one = {"shape": h["shapes"][k], "dtype": h["dtypes"][k]}
                if h["key_impls"][k]:
                    one["key_impl"] = h["key_impls"][k]
                out[i] = (one, [bufs[k]])
        return out

    def _wait_ready(self, xs: Sequence[RemoteArray]) -> None:
        self._request(xs, "wait")

    def _ready_future(self, x: RemoteArray) -> Future[Any]:
        """A future done once ``x`` is computed, its exception the error ``x`` holds.

        Known already (a fetch or wait returned, or the controller's notice came): done
        now. Otherwise its host is asked once, through the IO thread, and the question
        stays open until it answers: asking again meanwhile (``pw.wait`` in a loop)
        shares the same answer instead of asking again.
        """
        self._check_open()
        x._check_usable()
        if x._client is not self:
            raise ValueError("this RemoteArray belongs to another client")
        with self._cond:
            known = x._ready or (x._lid != _LOCAL_LID and self._is_done(x._lid))
            err = self._error_of(x)
        if known or err is not None:
            done: Future[Any] = Future()
            if err is not None:
                done.set_exception(err)
            else:
                done.set_result(None)
            return done
        x.slice.check_active()
        handle = x.handle
        with self._asked_lock:
            fut = self._asked.get(handle)
            if fut is not None:
                return fut
            fut = self._asked[handle] = self._io.host_request(
                x.slice.data_address, {"t": "wait", "handle": handle}
            )
        ref = weakref.ref(x)

        def answered(f: Future[Any]) -> None:
            with self._asked_lock:
                self._asked.pop(handle, None)
            y = ref()
            if y is None or y._deleted:
                return  # the host answered its deletion; nobody reads it now
            exc = f.exception()
            if isinstance(exc, RemoteError):
                self._errors[handle] = exc
            elif exc is not None:
                return  # the client closed or broke: no word on the array
            y._ready = True
            if self._fed:
                self._fed_landed([handle])

        fut.add_done_callback(answered)
        return fut

    def _error_of(self, x: RemoteArray) -> RemoteError | None:
        return self._errors.get(x.handle)


def _same(v: Any) -> Any:
    return v


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _weak_if_scalar(value: Any, out: RemoteArray) -> RemoteArray:
    """A Python number is typed weakly, as jax.device_put and jax.jit type one: it takes
    the dtype of the arrays it meets (``x_f16 * 2.0`` stays float16)."""
    if type(value) in (int, float, complex):
        out._mark_weak()
    return out


def _check_python_ints(value: Any, data: np.ndarray, dtype: np.dtype[Any]) -> None:
    """Python ints that ``dtype`` cannot hold raise OverflowError, as in JAX, instead of
    wrapping around when NumPy's int64 becomes ``dtype``."""
    if not data.size:
        return
    info = np.iinfo(dtype)
    lo, hi = int(data.min()), int(data.max())
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise OverflowError(
            f"Python int {bad} too large to convert to {dtype} (from {_short(value)}): "
            "without 64-bit types (jax_enable_x64), JAX's integers are 32-bit. Pass "
            f"values between {info.min} and {info.max}, or a float"
        )
