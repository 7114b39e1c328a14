"""The wire: garbage never takes a process down; versions are checked at connect."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config, Versions, local_versions

GARBAGE: list[list[bytes]] = [
    [b""],
    [b"\xff\xfe\x00garbage"],
    [msgpack.packb([1, 2, 3])],
    [msgpack.packb({"t": 7})],
    [msgpack.packb({"t": "no-such-type"})],
    [msgpack.packb({"t": "launch"})],
    [
        msgpack.packb(
            {"t": "launch", "lid": "x", "slice": 1, "pid": None, "ins": 0, "outs": 0, "donate": 0}
        )
    ],
    [
        msgpack.packb(
            {
                "t": "put",
                "rid": 1,
                "handle": 2,
                "shape": [4],
                "dtype": "<f4",
                "spec": [],
                "devices": [0],
                "mesh": [["x", 1]],
            }
        ),
        b"short",
    ],
    [msgpack.packb({"t": "hello", "role": "client", "versions": {"nope": 1}})],
    [msgpack.packb({"t": "batch"}), b"\x00\x01", msgpack.packb({"t": "allocate"})],
    [msgpack.packb({"t": "register", "host": 1})],
    [msgpack.packb({"t": "expect", "rid": 1, "handle": "x"})],
    [msgpack.packb({"t": "put_failed", "rid": 1, "handle": 5, "error": {"nope": 1}})],
    [np.random.default_rng(0).bytes(4096)],
]


def _raw_dealer(ctx: zmq.Context[Any], address: str) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.connect(address)
    return s


def _hello(sock: zmq.Socket[Any], client: pw.Client | None = None) -> dict[str, Any]:
    """Say hello as a new client to the controller, or as ``client`` says it to a host
    (with its tenant id and token)."""
    plain = {"t": "hello", "role": "client", "versions": local_versions().to_dict()}
    hello = {**(plain if client is None else client._direct.hello), "rid": 1}
    sock.send_multipart([msgpack.packb(hello)])
    return dict(msgpack.unpackb(sock.recv_multipart()[0]))


def _bye(sock: zmq.Socket[Any]) -> None:
    """Leave as a client leaves: over inproc:// the controller sees no socket close, and
    the tenant would stay (for its lease) in the shared cluster's status."""
    sock.send_multipart([msgpack.packb({"t": "bye"})])
    sock.close(0)


def test_garbage_to_every_socket_gets_errors_and_everyone_keeps_working(
    cluster: pw.InProcessCluster, client: pw.Client
) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    ctx = cluster.context
    targets = [
        cluster.controller.client_address,
        cluster.controller.host_address,
        *(h.data_address for h in cluster.hosts),
    ]
    for address in targets:
        for authenticated in (False, True):
            sock = _raw_dealer(ctx, address)
            if authenticated and address != cluster.controller.host_address:
                assert _hello(sock, client)["t"] == "welcome"
            for frames in GARBAGE:
                sock.send_multipart(frames)
                reply = msgpack.unpackb(sock.recv_multipart()[0])
                assert reply["t"] in ("error", "refuse", "failed", "reply"), reply
                text = reply.get("message") or reply.get("reason") or str(reply.get("error", ""))
                assert text or reply["t"] == "reply"
            if address == vs.data_address and authenticated:
                # A Dask put's failure names a handle the host expects: another array's
                # is not failed by it.
                error = {"message": "not yours", "kind": "dask"}
                sock.send_multipart(
                    [
                        msgpack.packb(
                            {"t": "put_failed", "rid": 2, "handle": x.handle, "error": error}
                        )
                    ]
                )
                assert msgpack.unpackb(sock.recv_multipart()[0])["t"] == "reply"
            if address == cluster.controller.client_address:
                _bye(sock)  # a tenant once welcomed
            else:
                sock.close(0)
    # Everyone keeps serving, including this tenant's arrays and programs.
    np.testing.assert_array_equal((x + 1).fetch(), np.arange(1, 5, dtype=np.float32))
    assert cluster.controller.statistics().live_hosts == 2


def test_a_bad_weight_is_refused_at_once_by_the_client_and_by_the_controller(
    cluster: pw.InProcessCluster,
) -> None:
    # The controller raised inside its hello, registered half a tenant and never
    # answered: the client waited its 30 s out. NaN would have broken the scheduler's
    # order for every tenant.
    for weight in (-1.0, 0, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match=r"a finite number > 0; got"):
            pw.Client(cluster, weight=weight)  # type: ignore[arg-type]
    observer = cluster.client()

    def tenants() -> set[int]:
        return set(observer.status().tenants.tenant)

    before = tenants()
    sock = _raw_dealer(cluster.context, cluster.controller.client_address)
    for weight in (-1.0, "heavy", None):
        hello = {"t": "hello", "role": "client", "rid": 1, "weight": weight}
        sock.send_multipart([msgpack.packb({**hello, "versions": local_versions().to_dict()})])
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["t"] == "refuse" and "a finite number > 0" in reply["reason"], reply
    sock.close(0)
    assert tenants() <= before  # no half-made tenant
    observer.close()
    with pw.Client(cluster, weight=np.float32(2.5)) as client:  # NumPy numbers are numbers
        assert client.status().tenants.set_index("tenant").weight[client.tenant] == 2.5


def test_a_request_with_a_bad_field_hears_why_at_once(cluster: pw.InProcessCluster) -> None:
    """The error names the field and carries the request's id, so the request fails now
    (it timed out after 60 s, the reason only in the client's log)."""
    sock = _raw_dealer(cluster.context, cluster.controller.client_address)
    assert _hello(sock)["t"] == "welcome"
    bad = {"t": "allocate", "rid": 7, "mesh": [["x", 1]], "name": 123}
    sock.send_multipart([msgpack.packb(bad)])
    reply = msgpack.unpackb(sock.recv_multipart()[0])
    assert reply["t"] == "error" and reply["rid"] == 7, reply
    assert "field 'name' must be str/NoneType; got int" in reply["message"]
    _bye(sock)


def test_a_programs_compiler_options_and_axis_types_are_bound_to_its_id(
    cluster: pw.InProcessCluster,
) -> None:
    """Options another client did not send cannot be slipped under its program's id, and
    options of the wrong types are refused with the reason."""
    from pathways_nb._core import program_id

    sock = _raw_dealer(cluster.context, cluster.controller.client_address)
    assert _hello(sock)["t"] == "welcome"
    blob, key = b"exported", b"key"
    header = {"t": "program", "name": "p", "nin": 1, "nout": 1, "in_specs": [[]], "key": key}
    cases = [
        ({"xla_fast": True}, program_id(blob, key), "the id is not the digest"),
        ({"xla_fast": [1]}, program_id(blob, key), "is a boolean, number or string"),
        ("fast", program_id(blob, key), "is a dict of XLA option names"),
    ]
    for options, pid, why in cases:
        sock.send_multipart([msgpack.packb({**header, "pid": pid, "options": options}), blob])
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["t"] == "error" and why in reply["message"], reply
    # The mesh axis types it compiles for are bound alike.
    for types, why in ((["Explicit"], "the id is not the digest"), (["Sideways"], "axis types")):
        msg = {**header, "pid": program_id(blob, key), "axis_types": types}
        sock.send_multipart([msgpack.packb(msg), blob])
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["t"] == "error" and why in reply["message"], reply
    # And what the bytes are: an export, or a pickled function a host calls.
    for kind, pid, why in (
        ("python", program_id(blob, key), "the id is not the digest"),
        (
            "shell",
            program_id(blob, key, kind="shell"),
            "kind must be one of ('xla', 'python', 'hlo')",
        ),
    ):
        sock.send_multipart([msgpack.packb({**header, "pid": pid, "kind": kind}), blob])
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["t"] == "error" and why in reply["message"], reply
    assert program_id(blob, key, {"xla_fast": True}) != program_id(blob, key)
    assert program_id(blob, key, {}) == program_id(blob, key)
    assert program_id(blob, key, kind="python") != program_id(blob, key)
    assert program_id(blob, key, kind="xla") == program_id(blob, key)
    _bye(sock)


def test_oversized_message_is_refused_with_a_reason() -> None:
    with pw.InProcessCluster(1, 2, config=Config(max_control_message=1024)) as c:
        sock = _raw_dealer(c.context, c.controller.client_address)
        sock.send_multipart([msgpack.packb({"t": "heartbeat"}), b"x" * 4096])
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["t"] == "error" and "larger than this endpoint accepts" in reply["message"]
        sock.close(0)
        with c.client() as client:
            assert client.status().islands.shape[0] == 1


def test_closing_a_cluster_closes_its_open_clients(caplog: pytest.LogCaptureFixture) -> None:
    """Clients share the cluster's ZeroMQ context, whose term() waits for every socket:
    closing the cluster first closes them, and a put answered after its client left is
    dropped without an error on the host."""
    c = pw.InProcessCluster(1, 2)
    client = pw.Client(c)  # as with pw.LocalCluster; c.client() is the same
    vs = client.allocate({"x": 2})
    assert np.asarray(vs.put(np.ones(4, np.float32), P("x"))).sum() == 4
    pending = [vs.put(np.full(4, i, np.float32), P("x")) for i in range(8)]
    closer = threading.Thread(target=c.close, daemon=True)
    with caplog.at_level(logging.WARNING, logger="pathways_nb"):
        closer.start()
        closer.join(30)
    assert not closer.is_alive(), "closing the cluster hung on its open client"
    assert client.closed
    with pytest.raises(pw.ClosedError, match="client was closed"):
        np.asarray(pending[-1])
    for connect in (c.client, lambda: pw.Client(c)):
        with pytest.raises(pw.ClosedError, match="cluster was closed"):
            connect()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_version_mismatch_is_refused_naming_the_side_to_upgrade(
    cluster: pw.InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = local_versions()
    old = Versions(**{**mine.to_dict(), "jax": "0.0.1"})
    monkeypatch.setattr("pathways_nb.client._session.local_versions", lambda: old)
    with pytest.raises(pw.VersionMismatchError) as info:
        cluster.client()
    msg = str(info.value)
    assert "jax 0.0.1 on the client" in msg and "upgrade" in msg


def test_lapsed_lease_frees_the_slices_of_a_vanished_client() -> None:
    with pw.InProcessCluster(1, 2, config=Config(lease_seconds=0.3)) as c:
        sock = _raw_dealer(c.context, c.controller.client_address)
        assert _hello(sock)["t"] == "welcome"
        sock.send_multipart(
            [msgpack.packb({"t": "allocate", "rid": 2, "mesh": [["x", 2]], "name": None})]
        )
        assert msgpack.unpackb(sock.recv_multipart()[0])["slice"]["devices"] == [0, 1]
        deadline = time.monotonic() + 10
        while c.controller.statistics().tenants and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = c.controller.statistics()
        assert stats.tenants == 0 and stats.slices == 0
        with c.client() as client:
            assert client.allocate({"x": 2}).devices == [0, 1]
        sock.close(0)


def test_status_and_events_are_dataframes(client: pw.Client) -> None:
    vs = client.allocate({"data": 4}, name="train")
    x = vs.put(np.ones(8, np.float32), P("data"))
    f = pw.jit(lambda x: x * 3, name="triple")
    for _ in range(5):
        x = f(x)
    x.block_until_ready()
    client.wait_all(10)
    st = client.status()
    assert set(st.islands.columns) >= {"island", "host", "alive", "devices", "free"}
    assert st.devices.shape[0] == 8
    assert (st.devices["slice"] == "train").sum() == 4
    assert "train" in set(st.slices["name"])
    assert "islands" in repr(st) and "train" in repr(st)
    # The snapshot carries the newest of this client's events too.
    assert list(st.events.columns)[:4] == ["time", "kind", "tenant", "lid"]
    assert 0 < len(st.events) <= 20 and set(st.events.tenant) <= {0, client.tenant}
    assert st.events.program.iloc[-1] == "triple"
    ev = client.events()
    mine = ev[ev.program == "triple"]
    assert list(mine.kind.value_counts().sort_index().items()) == [
        ("end", 5),
        ("launch", 5),
        ("start", 5),
    ]
    starts = mine[mine.kind == "start"].set_index("lid").time
    ends = mine[mine.kind == "end"].set_index("lid").time
    assert (starts <= ends.loc[starts.index]).all()
    assert set(mine.host) == {vs.host} and set(mine.island) == {vs.island}
    # since= takes a value of the frame's own time column, or any other datetime.
    # The cut falls in the widest gap between two events, on a whole microsecond, so that
    # every form of it (a float of seconds too) falls between the same two events.
    times = ev.time.sort_values().reset_index(drop=True)
    k = int(times.diff().iloc[1:].idxmax())
    cut = (times[k - 1] + (times[k] - times[k - 1]) / 2).floor("us")
    want = ev[ev.time >= cut]
    for since in (cut, cut.to_datetime64(), cut.to_pydatetime(), cut.timestamp()):
        got = client.events(since=since)
        assert len(got) >= len(want) and got.time.min() >= cut, type(since)
    assert len(client.events(since=cut.tz_localize("UTC").tz_convert("Asia/Tokyo"))) >= len(want)
    with pytest.raises(TypeError, match=r"since is seconds since the epoch.*got str"):
        client.events(since="yesterday")


def test_status_rows_match_its_frames_and_event_rows_page_the_log(client: pw.Client) -> None:
    vs = client.allocate({"data": 2}, name="rows")
    f = pw.jit(lambda x: x - 1, name="minus_one")
    st = client.status()
    # The plain rows are the frames' rows, column for column, and the repr starts with
    # the summary.
    for name, columns in pw.Status.COLUMNS.items():
        frame = getattr(st, name)
        assert tuple(frame.columns) == columns
        assert len(frame) == len(st.rows[name])
    assert [list(r) for r in st.slices.itertuples(index=False)] == st.rows["slices"]
    assert repr(st).splitlines()[0] == st.summary
    assert f"{len(st.rows['slices'])} slices" in st.summary
    # A cursor pages the log: the first call has everything so far, the next only what
    # came after it.
    first = client.event_rows()
    assert first.next >= len(first.rows)
    x = vs.put(np.ones(4, np.float32), P("data"))
    y = f(x)
    y.block_until_ready()
    client.wait_all(10)
    rows, cursor = client.event_rows(first.next)
    kinds = [r[1] for r in rows if r[4] == "minus_one"]
    assert sorted(kinds) == ["end", "launch", "start"]
    assert cursor > first.next
    assert len(rows[0]) == len(pw.Status.COLUMNS["events"])
    assert client.event_rows(cursor).rows == []
    # since= leaves out what is older, from the start of the log as after a cursor.
    cut = max(r[0] for r in rows if r[4] == "minus_one")
    recent = client.event_rows(0, since=cut)
    assert recent.next == cursor and recent.rows
    assert all(r[0] >= cut for r in recent.rows)
    assert [r for r in client.event_rows(0).rows if r[0] >= cut] == recent.rows
    with pytest.raises(TypeError, match=r"after is a cursor.*got -1"):
        client.event_rows(-1)
    with pytest.raises(TypeError, match=r"after is a cursor.*got '3'"):
        client.event_rows("3")  # type: ignore[arg-type]
    # The same of events(after=), and of a cursor past what the wire carries.
    for bad in (-1, "5", 1.5, 10**20):
        with pytest.raises(TypeError, match=rf"after is a cursor.*got {bad!r}"):
            client.events(after=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"after is a cursor.*got 100000000000000000000"):
        client.event_rows(10**20)
    with pytest.raises(TypeError, match=r"all_tenants is True or False; got 'no'"):
        client.events(all_tenants="no")  # type: ignore[arg-type]
    assert client.event_rows(cursor).rows == []  # the client serves on


def test_lost_host_turns_arrays_into_data_loss(cluster: pw.InProcessCluster) -> None:
    # A private cluster: losing a host must not disturb the shared one.
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})
        assert vs.host != other.host
        x = vs.put(np.ones(2, np.float32), P("x"))
        y = other.put(np.ones(2, np.float32), P("x"))
        c.controller.host_lost(vs.host, "test")
        deadline = time.monotonic() + 10
        while vs.state != "lost" and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pw.DataLossError, match="lost"):
            x.fetch()
        with pytest.raises(pw.DataLossError):
            pw.jit(lambda a: a + 1)(x)
        np.testing.assert_array_equal((y + 1).fetch(), np.full(2, 2.0, np.float32))


def _wait_state(vs: pw.VirtualSlice, state: str) -> None:
    deadline = time.monotonic() + 10
    while vs.state != state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert vs.state == state


def test_a_lost_slice_is_remapped_onto_its_restarted_host_and_training_goes_on() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})
        index = [h.name for h in c.hosts].index(vs.host)
        step = pw.jit(lambda w, g: w - 0.5 * g)
        w0 = np.arange(2.0, dtype=np.float32)
        w = vs.put(w0, P("x"))
        g = vs.put(np.ones(2, np.float32), P("x"))
        w = step(w, g)
        checkpoint = w.fetch()  # what a training loop keeps on the notebook's side
        copy = pw.jit(lambda a: a * 1, slice=other)(w)  # moved to the other host
        np.testing.assert_array_equal(copy.fetch(), checkpoint)
        c.controller.host_lost(vs.host, "test")
        _wait_state(vs, "lost")
        with pytest.raises(pw.DataLossError):
            step(w, g)
        with pytest.raises(TimeoutError, match="still lost"):
            vs.wait_active(timeout=0.2)
        c.restart_host(index)
        assert vs.wait_active(timeout=10) is vs
        assert vs.epoch == 1 and vs.host == c.hosts[index].name and len(vs.devices) == 2
        # Its old arrays went with the old host, and say where the slice is now.
        assert "lost" in repr(w)
        for old in (w, g):
            with pytest.raises(pw.DataLossError, match="remapped onto host"):
                old.fetch()
            with pytest.raises(pw.DataLossError, match="remapped onto host"):
                step(old, old)
        # A program given a lost handle anyway hears it from the controller.
        w._epoch = vs.epoch
        with pytest.raises(pw.DataLossError, match="was lost with host"):
            step(w, w).fetch()
        # From the checkpoint, training goes on on the same slice object, as plain JAX.
        w = vs.put(checkpoint, P("x"))
        g = vs.put(np.ones(2, np.float32), P("x"))
        for _ in range(3):
            w = step(w, g)
        np.testing.assert_allclose(w.fetch(), w0 - 0.5 * 4)
        np.testing.assert_array_equal(copy.fetch(), checkpoint)  # the other host kept it
        moved = pw.jit(lambda a: a * 2, slice=other)(w)  # host to host from the new one
        np.testing.assert_allclose(moved.fetch(), 2 * (w0 - 2.0))
        events = client.events()
        assert "remap" in set(events.kind)
        assert client.status().slices.set_index("slice").loc[vs.id, "state"] == "active"


def test_without_remapping_a_lost_slice_stays_lost_and_its_devices_are_free() -> None:
    config = Config(remap_lost_slices=False)
    with pw.InProcessCluster(1, 2, config=config) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        c.controller.host_lost(vs.host, "test")
        _wait_state(vs, "lost")
        c.restart_host(0)
        fresh = client.allocate({"x": 2})  # the restarted host's devices are free
        assert fresh.host == vs.host and vs.state == "lost"
        with pytest.raises(TimeoutError):
            vs.wait_active(timeout=0.3)
        vs.release()
        with pytest.raises(pw.ClosedError, match="released"):
            vs.wait_active(timeout=0.3)
        fresh.release()
        lost = client.allocate({"x": 2})
        c.controller.host_lost(lost.host, "test")
        _wait_state(lost, "lost")
        threading.Timer(0.2, client.close).start()
        with pytest.raises(pw.ClosedError, match="client was closed"):
            lost.wait_active()  # no timeout: the client's closing ends the wait


def test_a_transfer_from_a_lost_host_fails_its_consumer_at_once() -> None:
    with pw.InProcessCluster(2, 2) as c, c.client() as client:
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})
        x = a.put(np.ones(2, np.float32), P("x"))
        slow = pw.jit(lambda v: v + 1, slice=a, name="slow")
        slow(x).block_until_ready()
        client.inject_fault(a, match="slow", kind="delay:3")
        z = pw.jit(lambda v: v * 2, slice=b)(slow(x))  # parked on b, waiting for a
        t0 = time.monotonic()
        c.controller.host_lost(a.host, "test")
        with pytest.raises(pw.DataLossError, match="lost"):
            z.fetch()
        assert time.monotonic() - t0 < 2.5  # well before the source could have sent it
        client.wait_all(timeout=10)  # the transfer is accounted for, not left pending


def _slow_to_load(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


class _SlowToLoad:
    """Unpickled on a host, it holds the thread that adds programs there."""

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return (_slow_to_load, (2.0,))


def test_a_compile_in_progress_on_a_lost_host_fails_instead_of_hanging() -> None:
    with pw.InProcessCluster(1, 2) as c, c.client() as client:
        vs = client.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P("x"))
        held = _SlowToLoad()
        pw.colocated(lambda a: (held, a)[1], out=lambda a: a)(x)  # holds the host's programs
        # Its output layout is unknown, so the first call asks the host to compile it;
        # that request waits behind the program being added when the host is declared lost.
        t = threading.Timer(0.3, c.controller.host_lost, (vs.host, "test"))
        t.start()
        with pytest.raises(pw.DataLossError, match="lost"):
            pw.jit(lambda a: a * 3, name="needs_compile")(x)
        t.join()


def test_a_silent_host_is_declared_lost_after_its_timeout() -> None:
    with (
        pw.InProcessCluster(2, 2, config=Config(host_timeout_seconds=1.5)) as c,
        c.client() as client,
    ):
        vs = client.allocate({"x": 2})
        other = client.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P("x"))
        y = other.put(np.ones(2, np.float32), P("x"))
        # The host stops serving without a word, as a hung or partitioned one would.
        next(h for h in c.hosts if h.name == vs.host).stop()
        deadline = time.monotonic() + 20
        while vs.state != "lost" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert vs.state == "lost"
        with pytest.raises(pw.DataLossError):
            x.fetch()
        np.testing.assert_array_equal((y + 1).fetch(), np.full(2, 2.0, np.float32))
        assert c.controller.statistics().live_hosts == 1


def test_a_stall_of_the_whole_process_loses_no_host() -> None:
    """Every thread of the process held off the interpreter for longer than a host's
    timeout and a client's lease (a long native call holding the lock, or the machine
    paused): the controller wakes to find no new message from anyone, and does not count
    its own absence as their silence."""
    with (
        pw.InProcessCluster(2, 2, config=Config(host_timeout_seconds=2.0, lease_seconds=2.0)) as c,
        c.client() as client,
    ):
        vs = client.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P("x"))
        np.testing.assert_array_equal((x + 1).fetch(), 2.0)
        before = sys.getswitchinterval()
        sys.setswitchinterval(30.0)
        try:
            end = time.monotonic() + 4.0  # this thread keeps the lock: nobody else runs
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(before)
        time.sleep(1.0)  # the controller ticks twice, the hosts beat once
        assert c.controller.statistics().live_hosts == 2
        assert vs.state == "active"
        np.testing.assert_array_equal((x + 2).fetch(), 3.0)
        kinds = set(client.events(all_tenants=True).kind)
        assert "host_lost" not in kinds and "tenant_leave" not in kinds


def test_a_compile_for_a_host_whose_connection_is_gone_fails_instead_of_hanging() -> None:
    # The host's socket closes without a word; the controller finds out only when sending
    # it the program to compile, well before the host's timeout.
    with (
        pw.InProcessCluster(1, 2, config=Config(host_timeout_seconds=120)) as c,
        c.client() as client,
    ):
        vs = client.allocate({"x": 2})
        x = vs.put(np.ones(2, np.float32), P("x"))
        next(h for h in c.hosts if h.name == vs.host).stop()
        time.sleep(0.5)  # the controller's socket notices the disconnect
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                pw.jit(lambda a: a * 3, name="needs_compile")(x)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        worker.join(20)
        assert not worker.is_alive(), "the call waited for a host that is gone"
        assert len(outcome) == 1 and isinstance(outcome[0], pw.DataLossError), outcome
        assert vs.state == "lost"
