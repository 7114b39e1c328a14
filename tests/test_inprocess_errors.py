"""Errors are values: failures reach the notebook as one readable exception."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest
from _interrupts import interrupted_when_blocked_in, outcomes
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config


def test_injected_fault_fails_outputs_and_consumers_with_same_cause(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    client.inject_fault(vs, match="producer")
    x = vs.put(np.ones(4, np.float32), P("data"))
    producer = pw.jit(lambda x: x + 1, name="producer")
    consumer = pw.jit(lambda x: x * 2, name="consumer")
    y = producer(x)
    z = consumer(y)
    with pytest.raises(pw.RemoteError) as info:
        z.fetch()
    err = info.value
    # Known failed from the answer itself, before the controller's notice comes.
    assert "failed" in repr(z) and z.is_ready()
    assert err.kind == "fault_injected"
    assert err.program == "producer" and err.host == vs.host and err.slice
    assert "injected fault" in str(err) and "producer" in str(err)
    with pytest.raises(pw.RemoteError, match="injected fault"):
        y.fetch()
    # The host keeps serving: the next program on the same slice runs.
    np.testing.assert_array_equal(producer(x).fetch(), np.full(4, 2.0, np.float32))
    rendered = "\n".join(err._render_traceback_())
    assert "RemoteError" in rendered and "producer" in rendered


def test_a_fault_for_no_live_host_says_what_inject_fault_takes(client: pw.Client) -> None:
    with pytest.raises(
        ValueError, match=r"a live host's name; got 'a' \(live hosts: \['host"
    ) as info:
        client.inject_fault("a", match="f")
    assert not str(info.value).startswith(("'", '"'))


def test_compile_failure_on_the_host(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(4, np.float32), P("data"))
    # A program exported for an accelerator the host does not have fails to compile there.
    vs.platform = "cuda"
    f = pw.jit(lambda x: x + 1, out_shardings=P("data"), name="wrong_platform")
    y = f(x)
    with pytest.raises(pw.RemoteError) as info:
        y.fetch()
    assert info.value.kind == "compile"
    assert info.value.program == "wrong_platform" and info.value.host == vs.host
    assert "cuda" in str(info.value).lower() or "platform" in info.value.remote_traceback.lower()
    vs.platform = "cpu"
    np.testing.assert_array_equal(pw.jit(lambda x: x - 1)(x).fetch(), np.zeros(4, np.float32))


def test_store_memory_limit() -> None:
    with pw.InProcessCluster(1, 2, config=Config(store_limit_bytes=64 * 1024)) as c:
        client = c.client()
        vs = client.allocate({"data": 2})
        small = vs.put(np.ones(4096, np.float32), P("data"))  # 16 KiB
        big = vs.put(np.ones(32 * 1024, np.float32), P("data"))  # 128 KiB: over the limit
        with pytest.raises(pw.ResourceExhaustedError, match="limit"):
            big.fetch()
        grow = pw.jit(lambda x: jax.numpy.tile(x, 8), name="grow")  # 128 KiB output
        with pytest.raises(pw.ResourceExhaustedError) as info:
            grow(small).fetch()
        assert info.value.program == "grow"
        np.testing.assert_array_equal((small + 1).fetch(), np.full(4096, 2.0, np.float32))
        client.close()


def test_a_program_the_machines_memory_cannot_hold_is_refused_before_it_runs(
    client: pw.Client,
) -> None:
    """A CPU host's devices allocate from the machine's memory, where running out ends the
    host: a launch whose outputs cannot fit fails as a value instead, and the host serves
    on. A fetch or a put the client's machine cannot hold is refused in the client."""
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(4, np.float32), P("data"))
    rows = 2 * psutil.virtual_memory().total // (4 * 1024)  # twice the machine, per device
    huge = pw.jit(lambda x: jax.numpy.zeros((rows, 1024)) + x.sum(), name="huge")
    y = huge(x)
    with pytest.raises(pw.ResourceExhaustedError, match="would allocate") as info:
        y.block_until_ready()
    assert info.value.program == "huge" and info.value.host == vs.host
    assert "available of" in str(info.value) and "shard replicated outputs" in str(info.value)
    with pytest.raises(pw.ResourceExhaustedError, match="would allocate"):
        (y + 1).block_until_ready()  # its consumers fail with the same cause
    # Fetching an array this machine cannot hold is refused before a byte moves; so is
    # putting one on a host of this machine (a broadcast view: nothing allocated here).
    with pytest.raises(pw.ResourceExhaustedError, match=r"fetching 2 arrays .*\(x\[:1000\]\)"):
        pw.fetch({"y": y, "x": x})
    view = np.broadcast_to(np.float32(1), (rows, 1024))
    with pytest.raises(pw.ResourceExhaustedError, match=r"putting a .* GiB array on slice"):
        vs.put(view, P())
    # A program above the size that is checked, which fits, runs (80 MiB: 40 on each device).
    fits = pw.jit(lambda x: jax.numpy.zeros((10 * 1024, 1024)) + x.sum(), name="fits")
    assert float(fits(x)[-1, -1]) == 4.0
    np.testing.assert_array_equal((x + 1).fetch(), np.full(4, 2.0, np.float32))


def test_an_array_donated_and_passed_again_in_one_call_is_refused(client: pw.Client) -> None:
    """XLA's CPU client ends the process on such a call (plain JAX's too): the client
    refuses it before anything is sent, and a launch that reaches a host so anyway fails
    there as a value while the host serves on."""
    vs = client.allocate({"data": 2})
    y = vs.put(np.ones(4, np.float32), P("data"))
    add = pw.jit(lambda a, b: a + b, donate_argnums=0, name="add")
    with pytest.raises(ValueError, match=r"add: the same array .* is passed 2 times and donated"):
        add(y, y)
    np.testing.assert_array_equal(add(y.copy(), y).fetch(), np.full(4, 2.0, np.float32))
    (prog,) = add._programs.values()
    out = client._launch(prog, vs, [y, y])  # what a client without the check would send
    with pytest.raises(pw.RemoteError, match="donated and passed 2 times") as info:
        out.fetch()
    assert info.value.kind == "invalid" and info.value.program == "add"
    z = vs.put(np.ones(4, np.float32), P("data"))
    np.testing.assert_array_equal(add(z, vs.put(np.ones(4, np.float32))).fetch(), 2 * np.ones(4))


def test_operators_refuse_what_jax_array_operators_refuse(client: pw.Client) -> None:
    """A string, None or a list beside a RemoteArray gets Python's own TypeError, as
    beside a jax.Array (no put is tried); ``==`` with one of them compares identities."""
    vs = client.allocate({"data": 2})
    x, j = vs.put(np.ones(4, np.float32), P("data")), jnp.ones(4, np.float32)
    for other in ("a", None, [1, 2, 3, 4], object()):
        for t in (j, x):
            with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for \+"):
                t + other
            with pytest.raises(TypeError) as info:
                other * t  # Python's message, which names the left operand's type
            assert "put" not in str(info.value)
        if isinstance(other, list):
            for t in (j, x):
                with pytest.raises(TypeError, match=r"unsupported operand type.* and 'list'"):
                    t == other  # noqa: B015
        else:
            assert (x == other) is (j == other) is False
            assert (x != other) is (j != other) is True
    for other in (np.ones(4, np.float32), np.float32(2), jnp.ones(4), 3, 0.5, True):
        np.testing.assert_array_equal((x + other).fetch(), j + other)
        np.testing.assert_array_equal((other - x).fetch(), other - j)


def test_a_ragged_put_says_what_put_takes(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    with pytest.raises(TypeError, match=r"array-like.*list \[\[1, 2\], \[3\]\] is not one") as info:
        vs.put([[1, 2], [3]])
    assert "several arrays go as a dict" in str(info.value) and info.value.__cause__ is None


def test_released_slice_and_deleted_array_fail_at_once(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = vs.put(np.ones(4, np.float32), P("data"))
    y = vs.put(np.ones(4, np.float32), P("data"))
    y.delete()
    with pytest.raises(pw.ClosedError, match="deleted"):
        y.fetch()
    with pytest.raises(pw.ClosedError, match="deleted"):
        pw.jit(lambda a: a)(y)
    other = client.allocate({"data": 2})
    vs.release()
    vs.release()  # twice is fine
    for action in (lambda: x.fetch(), lambda: vs.put(np.ones(2)), lambda: pw.jit(lambda a: a)(x)):
        with pytest.raises(pw.ClosedError, match="released"):
            action()
    # Its arrays went with it, as a deleted jax.Array reads; a function pinned to another
    # slice refuses one at once (it was the source host's late "not a live array").
    assert x.is_deleted() and repr(x).endswith(", released)")
    with pytest.raises(pw.ClosedError, match=r"lives on slice 's\d+', which was released"):
        pw.jit(lambda a: a, slice=other)(x)
    other.release()
    # The devices are free again.
    again = client.allocate({"data": 4})
    assert again.size == 4
    z = again.put(np.ones(4, np.float32), P("data"))
    client.release(again)  # the same as again.release()
    client.release(again)
    with pytest.raises(pw.ClosedError, match="released"):
        z.fetch()
    with pytest.raises(TypeError, match="expects a VirtualSlice"):
        client.release("s1")  # type: ignore[arg-type]


def test_a_refused_allocation_names_the_open_clients_holding_slices(
    cluster: pw.InProcessCluster,
) -> None:
    """A notebook cell that makes a client and allocates, run again, finds the devices
    taken by the client it made the first time: the error says so."""
    first = cluster.client()
    try:
        held = [first.allocate({"data": 4}) for _ in range(2)]
        again = cluster.client()
        with pytest.raises(pw.BusyError, match="free devices per island") as info:
            again.allocate({"data": 4})
        names = [vs.name for vs in held]
        assert f"tenant {first.tenant}: slices {names}" in str(info.value)
        assert "close the ones no longer used" in str(info.value)
        first.close()
        assert again.allocate({"data": 4}).size == 4
        again.close()
    finally:
        first.close()


def test_allocate_errors_say_what_is_free(client: pw.Client) -> None:
    with pytest.raises(pw.BusyError, match="free devices per island"):
        client.allocate({"data": 64})
    with pytest.raises(ValueError, match="named mesh"):
        client.allocate({})
    with pytest.raises(ValueError, match="positive integers"):
        client.allocate({"data": 0})
    with pytest.raises(TypeError, match="a slice's name is a string"):
        client.allocate({"data": 1}, name=123)  # type: ignore[arg-type]
    numpy_sized = client.allocate({"data": np.int64(1)})  # as jax.make_mesh takes them
    assert numpy_sized.mesh_shape == {"data": 1} and type(numpy_sized.mesh_shape["data"]) is int
    numpy_sized.release()
    vs = client.allocate({"data": 2}, name="train")
    with pytest.raises(ValueError, match="already has an active slice named 'train'"):
        client.allocate({"data": 2}, name="train")
    with pytest.raises(ValueError, match="names axis 'model'"):
        vs.put(np.ones(4), P("model"))
    with pytest.raises(ValueError, match=r"does not split evenly.*pad it to a multiple of 2"):
        vs.put(np.ones(3), P("data"))
    with pytest.raises(ValueError, match="rank 1: give at most one entry per dimension"):
        vs.put(np.ones(4), P("data", None))
    odd = vs.put(np.ones(3))
    for given, which in (("in_shardings", "input"), ("out_shardings", "output")):
        f = pw.jit(lambda a: a * 2, **{given: P("data")})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"{given} for {which} 0 \(float32\[3\]\): .*evenly"):
            f(odd)


def test_no_slice_is_a_clear_error(cluster: pw.InProcessCluster) -> None:
    with cluster.client() as c:
        with pytest.raises(ValueError, match="no slice to run on"):
            pw.jit(lambda: jax.numpy.zeros(2))()
        assert c.pending() == 0


def test_the_current_client_is_the_latest_still_open(cluster: pw.InProcessCluster) -> None:
    first = cluster.client()
    second = cluster.client()
    try:
        assert pw.Client.current() is second
        second.close()
        # The one connected before it is current again (it was "no open client").
        assert pw.Client.current() is first
        first.close()
        with pytest.raises(pw.ClosedError, match="no open pathways client"):
            pw.Client.current()
    finally:
        first.close()
        second.close()


def test_cancel_drops_queued_launches(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    client.inject_fault(vs, match="work", kind="delay:0.5")
    x = vs.put(np.ones(2, np.float32), P("data"))
    work = pw.jit(lambda x: x + 1, name="work")
    outs = [work(x) for _ in range(200)]
    cancelled = client.cancel()
    assert 0 < cancelled <= 200
    client.wait_all(timeout=30)
    failed = 0
    for o in outs:
        try:
            o.fetch()
        except pw.RemoteError as exc:
            assert exc.kind == "cancelled"
            failed += 1
    # Those still queued at the controller, plus those waiting in the host's own queue.
    assert cancelled <= failed <= 200


def test_backpressure_bounds_queued_launches(cluster: pw.InProcessCluster) -> None:
    with cluster.client() as c:
        c.max_queued = 8
        vs = c.allocate({"data": 2})
        c.inject_fault(vs, match="slow", kind="delay:0.3")
        x = vs.put(np.ones(2, np.float32), P("data"))
        slow = pw.jit(lambda x: x + 1, name="slow")
        peak = 0
        for _ in range(40):
            x = slow(x)
            peak = max(peak, c.pending())
        assert peak <= 8
        np.testing.assert_array_equal(x.fetch(), np.full(2, 41.0, np.float32))


def test_interrupt_while_fetching_cancels_queued_work(client: pw.Client) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    vs = client.allocate({"data": 2})
    client.inject_fault(vs, match="held", kind="delay:5.0")
    x = vs.put(np.ones(2, np.float32), P("data"))
    held = pw.jit(lambda x: x + 1, name="held")
    outs = [held(x) for _ in range(50)]
    with interrupted_when_blocked_in("request"), pytest.raises(KeyboardInterrupt):
        outs[-1].fetch()
    assert "cancelled" in outcomes(client, outs)


def test_interrupt_while_blocked_by_backpressure_cancels_queued_work(
    cluster: pw.InProcessCluster,
) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    with cluster.client() as c:
        c.max_queued = 4
        vs = c.allocate({"data": 2})
        c.inject_fault(vs, match="stuck", kind="delay:5.0")
        x = vs.put(np.ones(2, np.float32), P("data"))
        stuck = pw.jit(lambda x: x + 1, name="stuck")
        outs = []
        with interrupted_when_blocked_in("_backpressure"), pytest.raises(KeyboardInterrupt):
            for _ in range(100):
                outs.append(stuck(x))
        assert len(outs) == 4  # the fifth submission blocked, then was interrupted
        assert "cancelled" in outcomes(c, outs)


def test_an_address_where_another_kind_of_server_answers_says_so() -> None:
    """An HTTP server where the scheduler was expected: Dask's framing reads its reply
    as a message of some exabytes, and the MemoryError that makes was the whole story."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.recv(1)  # until the client hangs up

        t = threading.Thread(target=answer)
        t.start()
        with pytest.raises(pw.BrokenError, match=r"but not as a Dask scheduler does"):
            pw.Client(f"tcp://127.0.0.1:{port}")
        t.join(30)
