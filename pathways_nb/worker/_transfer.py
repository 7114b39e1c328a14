"""Host-to-host transfers: the source sends each destination shard's region, cut from its
own shards by index overlap; the destination assembles the array on its devices.

No byte passes through the controller or the client. The pieces of an array (one frame
per distinct destination region) travel in one data-plane message (``xfer``) that
describes itself fully (shape, dtype, destination sharding, each piece's region), so it
may arrive before or after the ``recv`` the destination's gang scheduler orders. The
destination also accepts an array's pieces spread over several such messages.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import zmq

from pathways_nb._core import (
    NO_TLS,
    BrokenError,
    ClosedError,
    RemoteError,
    TLSContexts,
    as_bytes,
    check_fits,
    decode_dtype,
    decode_spec,
    encode_dtype,
    local_versions,
    op_sharding,
    shard_indices,
)
from pathways_nb.wire import (
    DealerSocket,
    connect_dealer,
    dealer_sends_from_any_thread,
    decode,
    encode,
    receive,
    send_buffer,
)
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._hlo import hlo_fields
from pathways_nb.worker._hlo import sharding as hlo_sharding
from pathways_nb.worker._hostcopy import Index, from_regions, host_shards, normalize
from pathways_nb.worker._store import Entry, ObjectStore
from pathways_nb.worker._threads import as_host

log = logging.getLogger("pathways_nb.worker")


_STOP = object()
_SEND_STEP_MS = 500
# Arrays up to this size go out from the thread that learns they are computed (the
# completion thread, mostly), where the link allows it and the kernel takes the whole
# message at once: a second thread waking on the same buffer would cost every hop
# between islands a hand-off and, on a busy machine, a turn on the run queue. Larger
# ones go to the sending thread, so no loop waits on a copy or on the peer reading.
_INLINE_SEND_BYTES = 1 << 20


# index arithmetic (pure) --------------------------------------------------------------
def overlap(a: Index, b: Index) -> Index | None:
    """The intersection of two regions, or None when they do not meet."""
    out = []
    for (a0, a1), (b0, b1) in zip(a, b, strict=True):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi and not (a0 == a1 == b0 == b1):
            return None
        out.append((lo, hi))
    return tuple(out)


def _local(region: Index, origin: Index) -> tuple[slice, ...]:
    return tuple(slice(r0 - o0, r1 - o0) for (r0, r1), (o0, _) in zip(region, origin, strict=True))


def cut(
    region: Index, shards: Sequence[tuple[Index, np.ndarray]], dtype: np.dtype[Any]
) -> np.ndarray:
    """The ``region`` of an array assembled from the shards that overlap it.

    A shard that is exactly the region is returned as it is (no copy).
    """
    for index, data in shards:
        if index == region:
            return data
    out = np.empty(tuple(r1 - r0 for r0, r1 in region), dtype=dtype)
    covered = 0
    for index, data in shards:
        ov = overlap(index, region)
        if ov is None:
            continue
        out[_local(ov, region)] = data[_local(ov, index)]
        covered += math.prod(r1 - r0 for r0, r1 in ov)
    if covered < out.size:
        raise RemoteError(
            f"the source shards cover {covered} of the {out.size} elements of region {region}",
            kind="invalid",
        )
    return out


def pieces_for(
    shape: Sequence[int],
    spec: Sequence[Any],
    mesh: Sequence[Sequence[Any]],
    devices: Sequence[int],
) -> list[tuple[Index, list[int]]]:
    """Distinct destination regions and the destination devices that hold each."""
    regions: dict[Index, list[int]] = {}
    for dev, region in zip(devices, shard_indices(shape, spec, mesh), strict=True):
        regions.setdefault(region, []).append(int(dev))
    return list(regions.items())


def hlo_pieces(
    shape: Sequence[int], hlo: Any, devices: Sequence[int]
) -> list[tuple[Index, list[int]]]:
    """As :func:`pieces_for`, for a layout plain JAX named through the IFRT proxy:
    ``hlo`` is ``{"op": OpSharding bytes, "positions": [among devices]}``."""
    from jax._src import op_shardings
    from jax._src.lib import xla_client as xc

    positions, op = hlo_fields(hlo, len(devices), "a transfer's")
    indices = op_shardings.op_sharding_to_indices(
        xc.HloSharding.from_proto(op_sharding(op)), tuple(shape), len(positions)
    )
    regions: dict[Index, list[int]] = {}
    for p, index in zip(positions, indices, strict=True):
        regions.setdefault(normalize(index, tuple(shape)), []).append(int(devices[p]))
    return list(regions.items())


def _shard(value: Any, position: Any) -> Any:
    """The buffer of ``value``'s addressable shard at ``position`` (in its sharding's
    device order), as an array of its own."""
    n = len(value.sharding.addressable_devices)
    if type(position) is not int or not 0 <= position < n:
        raise RemoteError(
            f"a transfer's shard is the position of one of the source's {n} device "
            f"buffers (0..{n - 1}); got {position!r}",
            kind="invalid",
        )
    return value.addressable_data(position)


# source side ---------------------------------------------------------------------------
class Sender:
    """A thread that waits for source arrays and sends their pieces to other hosts.

    It owns one DEALER per destination host's data plane and says hello on each first.
    ``on_read(src)`` says a send no longer needs its source array (it may be donated).

    A small array bound for a link that any thread may send on waits in the sender
    instead, and the host's completion thread hands it over with :meth:`computed` as soon
    as the program that makes it has finished (``store`` gives its outcome then).
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        host: str,
        on_read: Callable[[int], None],
        store: ObjectStore | None = None,
        tls: TLSContexts = NO_TLS,
    ) -> None:
        self._ctx = ctx
        self._tls = tls
        self.host = host
        self._on_read = on_read
        self._store = store
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Held while the sockets, the counters or the waiting sends change: several
        # threads send.
        self._lock = threading.Lock()
        self._socks: dict[str, DealerSocket] = {}
        # destination address -> bytes its link's kernel buffer takes at once.
        self._rooms: dict[str, int] = {}
        # source handle -> sends waiting for its program to finish.
        self._waiting: dict[int, list[tuple[Entry, dict[str, Any]]]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.bytes_sent = 0
        self.transfers = 0
        # Destination layouts seen before: pieces_for costs tens of µs per send.
        self._pieces: dict[Any, list[tuple[Index, list[int]]]] = {}
        # What the hello on each link shows: the token for hosts (see _core._keys),
        # known once the controller has welcomed this host.
        self.token = b""

    def start(self) -> Sender:
        if self._thread is None:
            self._thread = threading.Thread(
                target=as_host(self._loop), name=f"pw-send-{self.host}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Send what is queued, drop what waits for programs that never finished (the
        host is going), close the sockets. Safe to call twice."""
        if self._thread is not None:
            self._stopping.set()
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        with self._lock:
            left, self._waiting = self._waiting, {}
            for s in self._socks.values():  # opened by other threads, without a loop
                s.close(0)
            self._socks.clear()
        for sends in left.values():
            for _, body in sends:
                self._on_read(int(body["src"]))

    def submit(self, entry: Entry, body: dict[str, Any]) -> None:
        """Send ``entry``'s array as ``body`` says, once it is computed."""
        if (
            self._store is None
            or entry.nbytes > _INLINE_SEND_BYTES
            or not dealer_sends_from_any_thread(body["address"])
            or entry.nbytes > self._room(body["address"])
        ):
            self._queue.put((entry, body))
            return
        with self._lock:
            # Checked under the lock computed() takes after the flag is set: a program
            # that finishes meanwhile finds this send waiting, or it sees the flag.
            ready = entry.ready
            if not ready:
                self._waiting.setdefault(int(body["src"]), []).append((entry, body))
        if ready:
            self._send_now(entry, body)

    def _room(self, address: str) -> int:
        """Bytes a send to ``address`` leaves at once (the kernel's buffer for it); 0
        while the host there cannot be reached (the sending thread then says why)."""
        room = self._rooms.get(address)
        if room is None:
            try:
                sock = self._sock(address)
            except BrokenError:
                return 0
            room = self._rooms[address] = send_buffer(sock)
        return room

    def computed(self, handles: Sequence[int]) -> None:
        """The programs that make ``handles`` finished, or failed: send what waits for
        them, on the calling thread."""
        with self._lock:
            if not self._waiting:
                return
            due = [s for h in handles for s in self._waiting.pop(h, ())]
        for entry, body in due:
            self._send_now(entry, body)

    def _send_now(self, entry: Entry, body: dict[str, Any]) -> None:
        src = int(body["src"])
        assert self._store is not None
        # A failure replaced the entry with its error; a deletion since leaves the one
        # the send was given, whose array is computed.
        current = self._store.get(src)
        try:
            self._send(current if current is not None else entry, body)
        except Exception as exc:
            self._log_failure(exc)
        finally:
            self._on_read(src)

    def _loop(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=1.0)
                except queue.Empty:
                    self._drain_replies()
                    continue
                if item is _STOP:
                    return
                entry, body = item
                try:
                    self._send(entry, body)
                except Exception as exc:
                    self._log_failure(exc)
                finally:
                    self._on_read(int(body["src"]))
                self._drain_replies()
        finally:
            with self._lock:
                for s in self._socks.values():
                    s.close(0)
                self._socks.clear()

    def _log_failure(self, exc: Exception) -> None:
        if isinstance(exc, ClosedError) and self._stopping.is_set():
            # The host is shutting down with the destination gone first: what the
            # transfer was for went with them, so it is no failure worth a traceback.
            log.info("%s", exc)
        else:
            log.error("host %s failed a transfer", self.host, exc_info=exc)

    def _sock(self, address: str) -> DealerSocket:
        with self._lock:
            s = self._socks.get(address)
        if s is not None:
            return s
        # Dialled outside the lock: a host slow to answer (up to the dial's timeout)
        # must not hold up the completion thread's sends to other hosts.
        s = self._connect(address)
        with self._lock:
            other = self._socks.setdefault(address, s)
        if other is not s:  # another thread connected meanwhile: keep one link
            s.close(0)
        return other

    def _connect(self, address: str) -> DealerSocket:
        # Blocking: a send returns once the kernel holds it, so the source may go.
        s = connect_dealer(
            self._ctx,
            address,
            blocking=True,
            peer="a host",
            tls=self._tls,
        )
        if isinstance(s, zmq.Socket):
            # In one process a send to a host already closed would wait forever
            # (nothing is there to take it): wait in steps, so stop() is heard.
            s.setsockopt(zmq.SNDTIMEO, _SEND_STEP_MS)
        hello = {
            "t": "hello",
            "role": "host",
            "rid": 0,
            "versions": local_versions().to_dict(),
            "token": self.token,
        }
        self._deliver(s, encode(hello))
        return s

    def _deliver(self, sock: DealerSocket, frames: list[Any], copy: bool = True) -> None:
        while True:
            try:
                sock.send_multipart(frames, copy=copy)
                return
            except zmq.Again:
                if self._stopping.is_set():
                    raise ClosedError(
                        f"host {self.host} closed with a transfer it could not deliver"
                    ) from None

    def _drain_replies(self) -> None:
        with self._lock:
            socks = list(self._socks.items())
        for address, s in socks:
            for frames in receive(s):
                try:
                    h = decode(frames).header
                except Exception:
                    continue
                if h.get("t") in ("error", "refuse", "failed"):
                    log.warning("host %s: transfer peer %s says %s", self.host, address, h)

    def _send(self, entry: Entry, body: dict[str, Any]) -> None:
        t0 = time.time()
        base = {
            "t": "xfer",
            "handle": body["dst"],
            "lid": body["lid"],
            "shape": body["shape"],
            "spec": body["spec"],
            "devices": body["devices"],
            "mesh": body["mesh"],
            "source": self.host,
            "t0": t0,
        }
        if "hlo_sharding" in body:
            base["hlo_sharding"] = body["hlo_sharding"]

        sock = self._sock(body["address"])
        try:
            regions, data, key_impl = self._prepare(entry, body)
        except Exception as exc:
            program, sname = entry.origin
            err = (
                exc
                if isinstance(exc, RemoteError)
                else to_remote(exc, "runtime", program=program, slice=sname, host=self.host)
            )
            self._deliver(sock, encode(base | {"pieces": 1, "error": err.to_dict()}))
            return
        if key_impl:
            base["key_impl"] = key_impl
        # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
        pieces = [p if p.flags.c_contiguous else p.copy(order="C") for p in data]
        # Every piece in one message: one send here and one arrival there, however many
        # destination regions the array has.
        header = base | {
            "pieces": len(pieces),
            "regions": [[list(r) for r in region] for region, _ in regions],
            "piece_dtype": encode_dtype(pieces[0].dtype),
            "piece_shapes": [list(p.shape) for p in pieces],
        }
        self._deliver(sock, [*encode(header), *(as_bytes(p) for p in pieces)], copy=False)
        with self._lock:
            self.bytes_sent += sum(p.nbytes for p in pieces)
            self.transfers += 1

    def _prepare(
        self, entry: Entry, body: dict[str, Any]
    ) -> tuple[list[tuple[Index, list[int]]], list[np.ndarray], str]:
        if entry.error is not None:
            raise entry.error
        value = entry.value
        address = body["address"]
        program, sname = entry.origin
        check_fits(
            entry.nbytes,
            f"moving a {entry.nbytes / 2**30:.2f} GiB array to host {address}, which "
            "runs on this machine and keeps its own copy,",
            "Move it in parts, reduce it on its slice first, or free arrays you no "
            "longer need (`del x` or `x.delete()`)",
            program=program or None,
            slice=sname or None,
            host=self.host,
            to=address,
        )
        jax.block_until_ready(value)
        key_impl = ""
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            key_impl = str(jax.random.key_impl(value))
            value = jax.random.key_data(value)
        if "shard" in body:
            # One device's buffer of the array (IFRT's disassembly): the destination's
            # array is that buffer, whatever the layout says of it (an unreduced
            # layout's devices hold partial sums, not regions).
            value = _shard(value, body["shard"])
        shape = tuple(value.shape)
        shards = host_shards(value)
        hlo = body.get("hlo_sharding")
        key = (
            shape,
            repr(body["spec"]),
            repr(body["mesh"]),
            tuple(body["devices"]),
            repr(hlo),
        )
        regions = self._pieces.get(key)
        if regions is None:
            if hlo is not None:
                regions = hlo_pieces(shape, hlo, body["devices"])
            else:
                regions = pieces_for(shape, body["spec"], body["mesh"], body["devices"])
            if len(self._pieces) >= 1024:
                self._pieces.clear()
            self._pieces[key] = regions
        data = [cut(region, shards, np.dtype(value.dtype)) for region, _ in regions]
        return regions, data, key_impl


# destination side ----------------------------------------------------------------------
class Assembler:
    """Collects the pieces of incoming arrays and stores each one whole.

    ``make_mesh(devices, mesh)`` gives the destination mesh; ``done(handle, lid, entry,
    t0, source)`` is called once per array, when its last piece (or an error) arrived.
    """

    def __init__(
        self,
        devices: dict[int, Any],
        make_mesh: Callable[[Sequence[int], Sequence[Sequence[Any]]], Any],
        done: Callable[[dict[str, Any], Any, RemoteError | None, int], None],
    ) -> None:
        self._devices = devices
        self._make_mesh = make_mesh
        self._done = done
        self._partial: dict[int, dict[Index, np.ndarray]] = {}
        self._bytes: dict[int, int] = {}
        # One sharding object per layout: JAX caches what it derives from a sharding
        # (device order, shard indices) on the object, so a fresh one per arrival costs
        # ~100 µs more to place.
        self._shardings: dict[Any, jax.sharding.Sharding] = {}

    def piece(self, h: dict[str, Any], bufs: Sequence[Any]) -> None:
        handle = int(h["handle"])
        if "error" in h:
            self._partial.pop(handle, None)
            nbytes = self._bytes.pop(handle, 0)
            self._done(h, None, RemoteError.from_dict(h["error"]), nbytes)
            return
        regions, shapes = h.get("regions"), h.get("piece_shapes")
        if (
            not bufs
            or not isinstance(regions, list)
            or not isinstance(shapes, list)
            or not len(regions) == len(shapes) == len(bufs)
        ):
            raise RemoteError(
                "a transfer message carries one frame per region it lists; got "
                f"{len(bufs)} frames for {regions!r}",
                kind="invalid",
            )
        dtype = decode_dtype(h["piece_dtype"])
        got = self._partial.setdefault(handle, {})
        for region, shape, buf in zip(regions, shapes, bufs, strict=True):
            arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
            got[tuple(tuple(r) for r in region)] = arr
            self._bytes[handle] = self._bytes.get(handle, 0) + arr.nbytes
        if len(got) < int(h["pieces"]):
            return  # more pieces to come
        del self._partial[handle]
        nbytes = self._bytes.pop(handle)
        for d in h["devices"]:
            if int(d) not in self._devices:
                raise RemoteError(
                    f"a transfer for device {d}, which is not on this host "
                    f"(it has {sorted(self._devices)})",
                    kind="invalid",
                )
        sharding = self._sharding(h)
        shape = tuple(int(n) for n in h["shape"])
        if h.get("key_impl"):
            shape = (*shape, *arr.shape[len(shape) :])
        # One call places every device's region; a piece several devices share (a
        # replicated or partly replicated layout) arrived once.
        value = from_regions(shape, arr.dtype, sharding, got)
        if h.get("key_impl"):
            value = jax.random.wrap_key_data(value, impl=h["key_impl"])
        self._done(h, value, None, nbytes)

    def _sharding(self, h: dict[str, Any]) -> jax.sharding.Sharding:
        hlo = h.get("hlo_sharding")
        key = (
            tuple(h["devices"]),
            tuple((str(a), int(n)) for a, n in h["mesh"]),
            repr(h["spec"]),
            repr(hlo),
        )
        sharding = self._shardings.get(key)
        if sharding is None:
            mesh = self._make_mesh(h["devices"], h["mesh"])
            if hlo is not None:
                positions, op = hlo_fields(hlo, mesh.devices.size, "a transfer's")
                flat = list(mesh.devices.flat)
                sharding = hlo_sharding([flat[p] for p in positions], op)
            else:
                sharding = jax.sharding.NamedSharding(mesh, decode_spec(h["spec"]))
            if len(self._shardings) >= 1024:
                self._shardings.clear()
            self._shardings[key] = sharding
        return sharding

    def forget(self, handle: int) -> None:
        self._partial.pop(handle, None)
        self._bytes.pop(handle, None)
