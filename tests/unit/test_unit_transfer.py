"""Transfer index arithmetic against JAX's own shard placement, and the parking lot."""

from __future__ import annotations

import threading
import time
from typing import Any

import jax
import numpy as np
import pytest
import zmq
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pathways_nb._core import RemoteError, encode_spec, shard_indices
from pathways_nb.wire import Poller, decode, receive
from pathways_nb.wire._stream import StreamRouter
from pathways_nb.worker._hostcopy import from_host, from_regions, host_shards, normalize, to_numpy
from pathways_nb.worker._parking import ParkingLot
from pathways_nb.worker._store import Entry, ObjectStore
from pathways_nb.worker._transfer import Sender, _shard, cut, hlo_pieces, overlap, pieces_for

MESHES = [((8,), ("x",)), ((2, 4), ("a", "b")), ((4, 2), ("a", "b"))]


def _send_body(src: int, address: str, device: int = 1) -> dict[str, Any]:
    """What the controller tells a source host to send: a 4-element array as ``src +
    100`` to one device of the host at ``address``."""
    return {
        "src": src,
        "dst": src + 100,
        "lid": src,
        "shape": [4],
        "spec": encode_spec(P()),
        "devices": [device],
        "mesh": [["x", 1]],
        "address": address,
    }


def _specs(names: tuple[str, ...]) -> list[P]:
    return [
        P(),
        P(names[0]),
        P(None, names[-1]),
        P(names),
        P(names[-1], names[0]) if len(names) > 1 else P(None, names[0]),
    ]


@pytest.mark.parametrize(("shape", "names"), MESHES)
def test_shard_indices_match_jax(shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    encoded_mesh = [[n, s] for n, s in zip(names, shape, strict=True)]
    for spec in _specs(names):
        sh = NamedSharding(mesh, spec)
        want = [normalize(sh.devices_indices_map((16, 8))[d], (16, 8)) for d in mesh.devices.flat]
        assert shard_indices((16, 8), encode_spec(spec), encoded_mesh) == want, spec


@pytest.mark.parametrize(("shape", "names"), MESHES)
def test_cut_assembles_any_destination_region(
    shape: tuple[int, ...], names: tuple[str, ...]
) -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    encoded_mesh = [[n, s] for n, s in zip(names, shape, strict=True)]
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    for src_spec in _specs(names):
        arr = jax.device_put(x, NamedSharding(mesh, src_spec))
        shards = [(normalize(s.index, x.shape), np.asarray(s.data)) for s in arr.addressable_shards]
        for dst_spec in _specs(names):
            pieces = pieces_for(x.shape, encode_spec(dst_spec), encoded_mesh, list(range(8)))
            # Devices holding the same region share one piece.
            assert sum(len(devs) for _, devs in pieces) == 8
            assert len({r for r, _ in pieces}) == len(pieces)
            for region, _ in pieces:
                got = cut(region, shards, np.dtype(np.float32))
                np.testing.assert_array_equal(got, x[tuple(slice(a, b) for a, b in region)])


@pytest.mark.parametrize(("shape", "names"), MESHES)
def test_host_copies_match_numpy_for_every_layout(
    shape: tuple[int, ...], names: tuple[str, ...]
) -> None:
    """``to_numpy`` and ``host_shards`` (a fetch, a transfer's source) read every layout,
    replicated, partly replicated and sharded, as ``np.asarray`` does."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    for spec in _specs(names):
        arr = jax.device_put(x, NamedSharding(mesh, spec))
        for _ in range(2):  # the second read takes the cached layout
            got = to_numpy(arr)
            np.testing.assert_array_equal(got, x)
            assert got.flags.c_contiguous
            shards = host_shards(arr)
            want = {normalize(s.index, x.shape) for s in arr.addressable_shards}
            assert {r for r, _ in shards} == want, spec
            for region, data in shards:
                np.testing.assert_array_equal(data, x[tuple(slice(a, b) for a, b in region)])


def test_host_copies_of_scalars_and_narrow_dtypes() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    scalar = jax.device_put(np.float32(3.5), NamedSharding(mesh, P()))
    assert to_numpy(scalar).shape == () and to_numpy(scalar) == np.float32(3.5)
    bf = jax.device_put(jax.numpy.arange(8, dtype=jax.numpy.bfloat16), NamedSharding(mesh, P("x")))
    got = to_numpy(bf)
    assert got.dtype == np.asarray(bf).dtype
    np.testing.assert_array_equal(got, np.asarray(bf))


@pytest.mark.parametrize(("shape", "names"), MESHES)
def test_placing_host_arrays_matches_device_put_for_every_layout(
    shape: tuple[int, ...], names: tuple[str, ...]
) -> None:
    """``from_host`` (a put) and ``from_regions`` (a transfer's destination) place every
    layout as ``jax.device_put`` does: same values, same sharding, same shard regions."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    for spec in _specs(names):
        sh = NamedSharding(mesh, spec)
        want = jax.device_put(x, sh)
        regions = {normalize(s.index, x.shape): np.asarray(s.data) for s in want.addressable_shards}
        for got in (from_host(x, sh), from_regions(x.shape, x.dtype, sh, regions)):
            assert got.sharding == sh and got.dtype == want.dtype, spec
            np.testing.assert_array_equal(np.asarray(got), x)
            for a, b in zip(got.addressable_shards, want.addressable_shards, strict=True):
                assert a.device == b.device and a.index == b.index, spec
                np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


def test_arrays_received_in_aligned_frames_become_device_buffers_without_a_copy() -> None:
    """What the stream's aligned frames are for: XLA's CPU client keeps a host array
    that starts on a 64-byte boundary as the device buffer itself (and copies one that
    does not), for a sharded and a replicated layout; a program that donates such a
    buffer leaves the received bytes as they were."""
    from pathways_nb.wire._recvpool import aligned_frames

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    x = np.arange(16 * 1024, dtype=np.float32).reshape(16, 1024)
    halves = [x[:8], x[8:]]
    frames = aligned_frames([h.nbytes for h in halves])
    received = []
    for frame, half in zip(frames, halves, strict=True):
        frame[:] = half.tobytes()
        received.append(np.frombuffer(frame, np.float32).reshape(half.shape))
    sharded = NamedSharding(mesh, P("x"))
    regions = {((0, 8), (0, 1024)): received[0], ((8, 16), (0, 1024)): received[1]}
    placed = from_regions(x.shape, x.dtype, sharded, regions)
    addresses = [np.asarray(s.data).ctypes.data for s in placed.addressable_shards]
    assert addresses == [r.ctypes.data for r in received]
    (whole,) = aligned_frames([x.nbytes])
    whole[:] = x.tobytes()
    one = np.frombuffer(whole, np.float32).reshape(x.shape)
    replicated = from_regions(
        x.shape, x.dtype, NamedSharding(mesh, P()), {((0, 16), (0, 1024)): one}
    )
    assert {np.asarray(s.data).ctypes.data for s in replicated.addressable_shards} == {
        one.ctypes.data
    }
    unaligned = np.frombuffer(frames[0], np.uint8)[4 : 4 + 4 * 1024].view(np.float32)
    copied = from_regions((1024,), np.float32, NamedSharding(mesh, P()), {((0, 1024),): unaligned})
    assert np.asarray(copied.addressable_shards[0].data).ctypes.data != unaligned.ctypes.data
    doubled = jax.jit(lambda v: v * 2, donate_argnums=0, out_shardings=sharded)(placed)
    np.testing.assert_array_equal(np.asarray(doubled), 2 * x)
    np.testing.assert_array_equal(received[0], x[:8])


def test_a_receive_buffer_is_taken_again_only_once_its_arrays_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large messages land in kept buffers (wire/_recvpool): a buffer that a device
    array still aliases is never handed out again; once its arrays are gone the next
    message of its size lands in it, up to the pool's bound."""
    import gc

    from pathways_nb.wire import _recvpool

    pool = _recvpool.ReceivePool(max_bytes=1 << 20)
    monkeypatch.setattr(_recvpool, "POOL", pool)
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    x = np.arange(16 * 1024, dtype=np.float32).reshape(16, 1024)

    def received() -> tuple[np.ndarray, int]:
        (frame,) = _recvpool.aligned_frames([x.nbytes])
        frame[:] = x.tobytes()
        arr = np.frombuffer(frame, np.float32).reshape(x.shape)
        return arr, arr.ctypes.data

    arr, first = received()
    placed = from_regions(x.shape, x.dtype, NamedSharding(mesh, P()), {((0, 16), (0, 1024)): arr})
    assert np.asarray(placed.addressable_shards[0].data).ctypes.data == first
    del arr
    gc.collect()
    other, second = received()  # the device still holds the first buffer
    assert second != first and pool.reused == 0
    del other
    gc.collect()
    again, third = received()  # the second came back when its array went
    assert third == second and pool.reused == 1
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v + 1)(placed)), x + 1)
    del placed, again
    gc.collect()
    _, fourth = received()
    assert fourth in (first, third) and pool.reused == 2
    # A buffer past the bound is not kept; a bound of 0 keeps none.
    assert _recvpool.ReceivePool(max_bytes=0).take(64).base is None
    small = _recvpool.ReceivePool(max_bytes=100)
    big = small.take(200)
    del big
    gc.collect()
    small.take(200)
    assert small.reused == 0


def test_placing_scalars_narrow_and_wide_dtypes() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    scalar = from_host(np.array(3.5, np.float32), NamedSharding(mesh, P()))
    assert scalar.shape == () and float(scalar) == 3.5
    for dtype in (np.bool_, np.int8, jax.numpy.bfloat16):
        x = np.arange(8).astype(dtype)
        got = from_host(x, NamedSharding(mesh, P("x")))
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(got), x)
    # A dtype JAX narrows without x64 (uint64 -> uint32) is placed as device_put does.
    wide = np.arange(8, dtype=np.uint64)
    want = jax.device_put(wide, NamedSharding(mesh, P("x")))
    got = from_host(wide, NamedSharding(mesh, P("x")))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_index_errors_say_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="names axis 'y'"):
        shard_indices((4,), ["y"], [["x", 2]])
    with pytest.raises(ValueError, match="does not split evenly into 4"):
        shard_indices((6,), ["x"], [["x", 4]])
    with pytest.raises(RemoteError, match="cover 2 of the 4"):
        cut(((0, 4),), [(((0, 2),), np.zeros(2, np.float32))], np.dtype(np.float32))


def test_overlap_of_regions() -> None:
    assert overlap(((0, 4), (0, 2)), ((2, 6), (1, 3))) == ((2, 4), (1, 2))
    assert overlap(((0, 2),), ((2, 4),)) is None
    assert overlap((), ()) == ()  # scalars always meet


def test_parking_lot_orders_and_blocks_by_array() -> None:
    lot = ParkingLot()
    assert not lot and lot.earliest_deadline() is None
    lot.park("run", {"lid": 1}, (10, 11), deadline=5.0)
    lot.park("send", {"src": 11}, (11,), deadline=3.0)
    assert lot.conflicts([11]) and lot.conflicts([10, 99]) and not lot.conflicts([99])
    assert lot.earliest_deadline() == 3.0
    taken = lot.remove(lambda p: p.kind == "send")
    assert [p.kind for p in taken] == ["send"] and len(lot) == 1
    assert lot.conflicts([10]) and lot.conflicts([11])
    (item,) = lot.take_all()
    assert item.body == {"lid": 1} and lot.earliest_deadline() is None
    assert not lot and not lot.conflicts([10])
    lot.repark(item)  # put back as it was: blocking its arrays, its deadline counted
    assert lot.conflicts([11]) and lot.earliest_deadline() == 5.0


def test_assembler_places_pieces_and_reuses_one_sharding_per_layout() -> None:
    """Arrivals assemble whole arrays on the destination devices; arrays of one layout
    share one sharding object (JAX caches what it derives from a sharding on it)."""
    from pathways_nb.worker._programs import Programs
    from pathways_nb.worker._transfer import Assembler

    programs = Programs("h", jax.devices()[:8])
    done: list[Any] = []
    asm = Assembler(
        {d.id: d for d in jax.devices()[:8]},
        programs.mesh,
        lambda h, value, err, nbytes: done.append((h["handle"], value, err, nbytes)),
    )
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    base = {"shape": [8, 8], "spec": [["x"]], "devices": [4, 5], "mesh": [["x", 2]]}
    halves = [np.ascontiguousarray(x[lo : lo + 4]) for lo in (0, 4)]
    regions = [[[0, 4], [0, 8]], [[4, 8], [0, 8]]]

    def message(handle: int, which: list[int]) -> dict[str, Any]:
        return base | {
            "handle": handle,
            "pieces": 2,
            "regions": [regions[i] for i in which],
            "piece_dtype": "<f4",
            "piece_shapes": [[4, 8] for _ in which],
        }

    # Both pieces in one message, as senders send them; then spread over two.
    asm.piece(message(1, [0, 1]), [halves[0].data, halves[1].data])
    asm.piece(message(2, [1]), [halves[1].data])
    assert [d[0] for d in done] == [1]
    asm.piece(message(2, [0]), [halves[0].data])
    assert [d[0] for d in done] == [1, 2]
    (_, a, err_a, nbytes), (_, b, _, _) = done
    assert err_a is None and nbytes == x.nbytes
    np.testing.assert_array_equal(np.asarray(a), x)
    assert {d.id for d in a.devices()} == {4, 5}
    assert a.sharding is b.sharding
    np.testing.assert_array_equal(np.asarray(b), x)
    with pytest.raises(RemoteError, match="one frame per region"):
        asm.piece(message(3, [0, 1]), [halves[0].data])


def test_a_sender_stops_while_a_transfer_waits_on_a_closed_host() -> None:
    """In one process a DEALER send to a host that closed finds nobody to take it;
    stopping the sender must not wait on it, and every source array is released."""
    ctx = zmq.Context()
    address = "inproc://a-host-that-closes"
    host = ctx.socket(zmq.ROUTER)
    host.bind(address)
    released: list[int] = []
    sender = Sender(ctx, "h0", released.append).start()
    value = np.arange(4, dtype=np.float32)

    def transfer(src: int) -> None:
        entry = Entry(value=value, nbytes=value.nbytes, ready=True)
        sender.submit(entry, _send_body(src, address, device=0))

    try:
        transfer(1)
        got = []
        while len(got) < 2:  # the hello, then the piece
            assert host.poll(30_000), "the first transfer never arrived"
            got.append(host.recv_multipart())
        host.close(linger=0)
        transfer(2)
        stopper = threading.Thread(target=sender.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=30)
        assert not stopper.is_alive(), "Sender.stop() still waits on the undeliverable send"
        assert released == [1, 2]
    finally:
        ctx.destroy(linger=0)


def test_a_small_array_leaves_from_the_thread_that_learns_it_is_computed() -> None:
    """Between processes a small array's send waits in the sender, and the completion
    thread (here: this one; the sender's own thread never runs) sends it when the program
    that makes it finished: failed, or computed and deleted since, it still goes."""
    router = StreamRouter("tcp://127.0.0.1:0", max_bytes=1 << 20)
    poller = Poller()
    poller.register(router, zmq.POLLIN)

    def messages(n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(out) < n:
            assert time.monotonic() < deadline, f"got {len(out)} of {n} messages"
            poller.poll(100)
            out.extend(decode(frames[1:]).header for frames in receive(router))
        return out

    store = ObjectStore()
    released: list[int] = []
    sender = Sender(zmq.Context(), "h0", released.append, store)
    value = jax.device_put(np.arange(4, dtype=np.float32), jax.devices()[0])

    def transfer(src: int) -> None:
        store.set(src, value, value.nbytes)  # made by a launch still running
        entry = store.get(src)
        assert entry is not None
        sender.submit(entry, _send_body(src, router.address))

    try:
        for src in (1, 2, 3):
            transfer(src)
        assert released == []  # nothing went: the launches have not finished
        store.mark_ready([1])
        sender.computed([1])
        hello, first = messages(2)
        assert hello["t"] == "hello" and first["handle"] == 101 and "error" not in first
        store.fail(2, RemoteError("boom", kind="runtime"))
        store.drop([3])
        sender.computed([2, 3])
        second, third = messages(2)
        assert second["handle"] == 102 and second["error"]["message"] == "boom"
        assert third["handle"] == 103 and "error" not in third
        assert released == [1, 2, 3]
    finally:
        sender.stop()
        router.close()


def test_an_array_larger_than_the_links_kernel_buffer_goes_to_the_sending_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sent from the completion thread, it would wait there for the peer to read."""
    router = StreamRouter("tcp://127.0.0.1:0", max_bytes=1 << 20)
    poller = Poller()
    poller.register(router, zmq.POLLIN)
    store = ObjectStore()
    released: list[str] = []
    sender = Sender(
        zmq.Context(), "h0", lambda src: released.append(threading.current_thread().name), store
    )
    monkeypatch.setattr("pathways_nb.worker._transfer.send_buffer", lambda sock: 8)
    value = jax.device_put(np.arange(4, dtype=np.float32), jax.devices()[0])
    store.set(1, value, value.nbytes, ready=True)
    sender.start()
    try:
        entry = store.get(1)
        assert entry is not None
        sender.submit(entry, _send_body(1, router.address))
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < 2:
            assert time.monotonic() < deadline, "the transfer never arrived"
            poller.poll(100)
            got.extend(decode(frames[1:]).header for frames in receive(router))
        assert got[1]["handle"] == 101
    finally:
        sender.stop()
        router.close()
    assert released == ["pw-send-h0"]


def test_a_send_to_a_host_that_cannot_be_reached_releases_its_source() -> None:
    """The sending thread tries, logs why it failed, and lets the source go; the
    executor's thread that submitted it is not the one that fails."""
    store = ObjectStore()
    released: list[int] = []
    sender = Sender(zmq.Context(), "h0", released.append, store).start()
    value = jax.device_put(np.arange(4, dtype=np.float32), jax.devices()[0])
    store.set(1, value, value.nbytes, ready=True)
    try:
        entry = store.get(1)
        assert entry is not None
        # Nothing listens there; the submitting thread is not the one that fails.
        sender.submit(entry, _send_body(1, "tcp://127.0.0.1:1"))
    finally:
        sender.stop()  # sends what was queued first
    assert released == [1]


def test_hlo_pieces_place_each_region_on_the_devices_the_positions_name() -> None:
    from jax._src.lib import xla_client as xc

    op = xc.OpSharding()
    op.type = xc.OpSharding.Type.OTHER
    op.tile_assignment_dimensions = [2, 1]
    op.tile_assignment_devices = [0, 1]
    hlo = {"op": op.SerializeToString(), "positions": [1, 3]}
    assert hlo_pieces((8, 4), hlo, [10, 11, 12, 13]) == [
        (((0, 4), (0, 4)), [11]),
        (((4, 8), (0, 4)), [13]),
    ]
    # Replicated (no bytes): one region, on every device named.
    assert hlo_pieces((8, 4), {"op": b"", "positions": [0, 2]}, [10, 11, 12, 13]) == [
        (((0, 8), (0, 4)), [10, 12]),
    ]
    for bad in ({"op": b"", "positions": [4]}, {"op": "x", "positions": [0]}, [1, 2]):
        with pytest.raises(RemoteError, match="hlo_sharding") as info:
            hlo_pieces((8, 4), bad, [10, 11, 12, 13])
        assert info.value.kind == "invalid"


def test_a_transfer_shard_names_one_of_the_sources_buffers() -> None:
    devices = jax.devices()[:2]
    value = jax.device_put(
        np.arange(8.0, dtype=np.float32), NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    )
    np.testing.assert_array_equal(np.asarray(_shard(value, 1)), np.arange(4.0, 8.0))
    for bad in (2, -1, "0", 1.0):
        with pytest.raises(RemoteError, match="shard") as info:
            _shard(value, bad)
        assert info.value.kind == "invalid"
