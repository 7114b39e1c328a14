"""New work for a lost slice waits for its remap; work that needs what was lost fails at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config


def _lose(c: pw.InProcessCluster, vs: pw.VirtualSlice) -> int:
    """Declare ``vs``'s host lost; the index of that host in the cluster."""
    index = [h.name for h in c.hosts].index(vs.host)
    c.controller.host_lost(vs.host, "test")
    deadline = time.monotonic() + 10
    while vs.state != "lost" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert vs.state == "lost"
    return index


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_puts_programs_and_moves_for_a_lost_slice_wait_for_its_remap() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        assert client.remap_wait_seconds == Config().remap_wait_seconds
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})
        w = vs.put(np.arange(2.0, dtype=np.float32), P("x"))
        y = other.put(np.full(2, 5.0, np.float32), P("x"))
        index = _lose(c, vs)
        # Work that needs the lost arrays fails at once, however long new work may wait.
        t0 = time.monotonic()
        with pytest.raises(pw.DataLossError, match="lost with host"):
            pw.jit(lambda a: a + 1)(w)
        with pytest.raises(pw.DataLossError, match="lost with host"):
            pw.jit(lambda a: a + 1, slice=other)(w)  # nor can they move
        assert time.monotonic() - t0 < 1.0
        # New work waits: a put, a pinned program given NumPy, an array moved there.
        waiting = [
            _in_thread(lambda: vs.put(np.full(2, 3.0, np.float32), P("x"))),
            _in_thread(lambda: pw.jit(lambda a: a * 2, slice=vs)(np.ones(2, np.float32))),
            _in_thread(lambda: pw.jit(lambda a: a + 1, slice=vs)(y)),
        ]
        time.sleep(0.3)
        assert all(t.is_alive() for t, _ in waiting)  # none failed while the slice is lost
        c.restart_host(index)
        for t, _ in waiting:
            t.join(timeout=20)
        results = [out.get("value", out.get("error")) for _, out in waiting]
        assert all(isinstance(r, pw.RemoteArray) for r in results), results
        assert vs.epoch == 1 and vs.state == "active"
        for r, want in zip(results, (3.0, 2.0, 6.0), strict=True):
            assert r.slice is vs and r._epoch == 1
            np.testing.assert_array_equal(r.fetch(), np.full(2, want, np.float32))


def test_a_checkpoint_the_hosts_wrote_restores_the_state_lost_with_a_host(
    tmp_path: Path,
) -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        client.allocate({"x": 2})  # the other island: no room to remap onto at once
        state = {
            "w": vs.put(np.arange(4, dtype=np.float32), P("x")),
            "b": vs.put(np.float32(2.0)),
        }
        pw.save(tmp_path / "ckpt", state)
        index = _lose(c, vs)
        with pytest.raises(pw.DataLossError):
            state["w"].fetch()
        waiting = _in_thread(lambda: pw.restore(tmp_path / "ckpt", state))
        time.sleep(0.2)
        assert waiting[0].is_alive()  # the restore waits for the slice's remap
        c.restart_host(index)
        waiting[0].join(timeout=30)
        back = waiting[1].get("value", waiting[1].get("error"))
        assert isinstance(back, dict), back
        assert vs.epoch == 1 and back["w"]._epoch == 1
        np.testing.assert_array_equal(back["w"].fetch(), np.arange(4, dtype=np.float32))
        assert float(back["b"].fetch()) == 2.0


def test_new_work_fails_once_the_wait_is_over_or_the_slice_is_released() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})  # no spare island: nothing can take vs
        _lose(c, vs)
        client.remap_wait_seconds = 0.3
        t0 = time.monotonic()
        with pytest.raises(pw.DataLossError, match=r"has not been remapped after 0.3 s") as info:
            vs.put(np.ones(2, np.float32), P("x"))
        assert 0.3 <= time.monotonic() - t0 < 3.0
        assert "PATHWAYS_REMAP_WAIT_SECONDS" in str(info.value)
        assert "2 free cpu devices" in str(info.value)
        client.remap_wait_seconds = 30.0
        threading.Timer(0.2, vs.release).start()
        t0 = time.monotonic()
        with pytest.raises(pw.ClosedError, match="released"):
            pw.jit(lambda a: a + 1, slice=vs)(np.ones(2, np.float32))
        assert time.monotonic() - t0 < 5.0
        # The other host and its slices never noticed.
        np.testing.assert_array_equal(
            (other.put(np.ones(2, np.float32), P("x")) + 1).fetch(), np.full(2, 2.0)
        )


def test_without_remapping_new_work_for_a_lost_slice_fails_at_once() -> None:
    config = Config(remap_lost_slices=False)
    with pw.InProcessCluster(1, 2, config=config) as c, c.client() as client:
        assert client.remap_wait_seconds == 0.0  # nothing would end the wait
        vs = client.allocate({"x": 2})
        _lose(c, vs)
        t0 = time.monotonic()
        with pytest.raises(pw.DataLossError, match="was lost with host"):
            vs.put(np.ones(2, np.float32), P("x"))
        assert time.monotonic() - t0 < 1.0


def test_a_lost_slice_moves_at_once_onto_a_spare_island_with_room() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        was = vs.host
        x = vs.put(np.ones(2, np.float32), P("x"))
        c.controller.host_lost(was, "test")
        # No host joins: the other island's free devices take the slice.
        deadline = time.monotonic() + 10
        while vs.epoch == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert vs.state == "active" and vs.epoch == 1
        assert vs.host != was and vs.host in {h.name for h in c.hosts}
        with pytest.raises(pw.DataLossError, match="remapped onto host"):
            x.fetch()
        y = vs.put(np.full(2, 4.0, np.float32), P("x"))
        np.testing.assert_array_equal((y * 2).fetch(), np.full(2, 8.0, np.float32))
        events = client.events()
        assert list(events[events.kind.isin(["host_lost", "remap"])].kind) == [
            "host_lost",
            "remap",
        ]


def test_devices_freed_by_a_release_or_a_departed_client_take_a_lost_slice() -> None:
    with pw.InProcessCluster(3, 2) as c, c.client() as client, c.client() as neighbour:
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})
        theirs = neighbour.allocate({"x": 2})
        assert len({vs.island, other.island, theirs.island}) == 3
        lost = other.host
        _lose(c, other)
        other_epoch = other.epoch
        _lose(c, vs)  # the oldest loss is remapped first
        vs.release()  # freed while lost: never remapped
        neighbour.close()  # its slice's devices are free now: the lost one moves there
        assert other.wait_active(timeout=10) is other
        assert other.epoch == other_epoch + 1 and other.host == theirs.host != lost
        assert vs.state == "released"
        np.testing.assert_array_equal(
            (other.put(np.ones(2, np.float32), P("x")) + 1).fetch(), np.full(2, 2.0)
        )


def test_a_fetch_from_a_host_lost_and_remapped_meanwhile_fails_instead_of_hanging() -> None:
    """The slice is lost and active again (on a spare island) before the fetch's next
    look, and the lost host answers nothing: the fetch must see the remap itself."""
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        host = c.hosts[[h.name for h in c.hosts].index(vs.host)]
        slow = pw.jit(lambda a: a + 1, name="slow")
        x = vs.put(np.ones(2, np.float32), P("x"))
        slow(x).block_until_ready()
        client.inject_fault(vs, match="slow", kind="delay:4")  # silent for 4 s
        y = slow(x)
        t0 = time.monotonic()
        fetching, out = _in_thread(y.fetch)
        deadline = time.monotonic() + 10
        while not host.store.has_ready_waiters([y.handle]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host.store.has_ready_waiters([y.handle])  # the fetch waits on the host
        c.controller.host_lost(vs.host, "test")
        fetching.join(timeout=10)
        assert not fetching.is_alive()
        assert isinstance(out.get("error"), pw.DataLossError), out
        assert time.monotonic() - t0 < 3.5  # before the host would have answered
        assert vs.epoch == 1 and vs.state == "active" and vs.host != host.name


def test_a_request_to_a_host_that_never_answers_its_hello_ends_when_the_slice_is_lost() -> None:
    """A thread's first request to a host opens a connection and waits for the host's
    hello; a host that died just then never sends it, and the wait must end as soon as
    the client knows (here a silent listener stands in for the dead host)."""
    import socket

    from pathways_nb.client._direct import DirectChannels

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    ctx = zmq.Context()
    channels = DirectChannels(ctx)
    t0 = time.monotonic()

    def check() -> None:
        if time.monotonic() - t0 > 0.3:
            raise pw.DataLossError("the host was lost")

    try:
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(pw.DataLossError, match="the host was lost"):
            channels.request([(address, {"t": "fetch", "handle": 1})], check)
        assert time.monotonic() - t0 < 5.0  # not the handshake's 30 s
    finally:
        channels.close()
        ctx.term()
        silent.close()


def test_a_host_whose_connection_closes_unanswered_ends_the_wait() -> None:
    """The host's process ended, and the controller, gone as well, said nothing of it:
    the answer cannot come on a closed connection, so the wait ends with a BrokenError
    instead of going on for ever."""
    from pathways_nb.client._direct import DirectChannels
    from pathways_nb.wire import Poller, decode, encode, receive
    from pathways_nb.wire._stream import StreamRouter

    router = StreamRouter("tcp://127.0.0.1:0")
    ctx = zmq.Context()
    channels = DirectChannels(ctx)
    channels.hello = {"t": "hello", "role": "client"}
    channels.gone_grace = 0.3

    def host() -> None:
        poller = Poller()
        poller.register(router, zmq.POLLIN)
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 2 and time.monotonic() < deadline:  # the hello, then the fetch
            poller.poll(100)
            for frames in receive(router):
                seen += 1
                if decode(frames[1:]).header["t"] == "hello":
                    router.send_multipart([frames[0], *encode({"t": "welcome"})])
        router.close()  # the fetch never answered

    t = threading.Thread(target=host)
    t.start()
    try:
        with pytest.raises(pw.BrokenError, match="closed its connection before it answered"):
            channels.request([(router.address, {"t": "fetch", "handle": 1})], lambda: None)
    finally:
        t.join(30)
        channels.close()
        ctx.term()


def test_a_controller_connection_a_callers_send_found_closed_breaks_the_client() -> None:
    """A caller's thread sends launches to the controller itself; when its send is what
    finds the connection closed, the connection leaves the IO thread's poll set, and is
    never ready again: the IO thread must still learn the controller went away."""
    from pathways_nb.client._io import IOThread
    from pathways_nb.wire._stream import StreamRouter

    router = StreamRouter("tcp://127.0.0.1:0")
    ctx = zmq.Context()
    io = IOThread(ctx, router.address, lambda _: None, heartbeat=60.0)
    io.start()
    try:
        dealer: Any = io._ctl
        dealer._drop(dealer._conn)  # what a send that hit a closed connection does
        deadline = time.monotonic() + 10
        while io.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert io.broken is not None and "went away" in io.broken
        with pytest.raises(pw.BrokenError, match="went away"):
            io.request({"t": "status"}).result(10)
    finally:
        io.stop()
        router.close()
        ctx.term()


def test_a_host_that_refuses_the_connection_fails_its_requests_and_nothing_else() -> None:
    """The client's IO thread connects to a host on first use; a host that died first
    (its slice just remapped there, say) fails what was sent to it, and the thread
    goes on serving the client."""
    import socket

    with pw.InProcessCluster(1, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
        closed.close()  # nothing listens there now
        fut = client._io.host_request(address, {"t": "hello", "role": "client"})
        with pytest.raises(pw.BrokenError, match="cannot reach a host"):
            fut.result(10)
        np.testing.assert_array_equal(
            (vs.put(np.ones(2, np.float32), P("x")) + 1).fetch(), np.full(2, 2.0)
        )


def test_a_failure_inside_the_client_io_thread_breaks_the_client_instead_of_hanging_it() -> None:
    with pw.InProcessCluster(1, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})

        def broken() -> None:
            raise RuntimeError("a bug")

        client._io._drain_outbox = broken  # type: ignore[method-assign]
        deadline = time.monotonic() + 10  # the thread drains its outbox on every turn
        while client._io.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pw.BrokenError, match=r"IO thread failed \(RuntimeError\('a bug'\)\)"):
            client.status()  # its request never leaves: the future fails instead
        with pytest.raises(pw.BrokenError, match="IO thread failed"):
            vs.put(np.ones(2, np.float32), P("x"))


def test_sockets_to_a_lost_host_are_closed_not_kept_for_the_clients_lifetime() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P("x"))  # through the IO thread's socket
        x.fetch()  # through this thread's own socket
        assert client._direct.sockets == 1
        io_sockets = client._io.host_sockets
        was = vs.host
        c.controller.host_lost(was, "test")
        deadline = time.monotonic() + 10
        while vs.epoch == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert vs.epoch == 1 and vs.host != was  # onto the spare island
        y = vs.put(np.full(2, 3.0, np.float32), P("x"))
        np.testing.assert_array_equal(y.fetch(), np.full(2, 3.0, np.float32))
        # This thread's socket to the lost host went on its next request; the IO
        # thread's went on its next turn: one socket each to the host that took over.
        assert client._direct.sockets == 1
        assert client._io.host_sockets == io_sockets


def test_batches_lost_with_their_host_are_computed_again_once_the_slice_is_remapped() -> None:
    import dask.array as da

    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        client.allocate({"x": 2})  # the other island is taken: the remap waits for a host
        rows = np.arange(64, dtype=np.float32).reshape(32, 2)
        it = pw.data.batches(da.from_array(rows, chunks=8), vs, batch_size=4, prefetch=2)
        got = [next(it).fetch() for _ in range(2)]  # batches 2 and 3 are put meanwhile
        index = _lose(c, vs)
        t, out = _in_thread(lambda: next(it).fetch())
        time.sleep(0.3)
        assert t.is_alive()  # waits for the remap instead of failing
        c.restart_host(index)
        t.join(timeout=20)
        assert "error" not in out, out["error"]
        got.append(out["value"])
        got += [b.fetch() for b in it]
        assert vs.epoch == 1
        np.testing.assert_array_equal(np.concatenate(got), rows)  # every row, once, in order
