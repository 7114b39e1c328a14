"""A host's executor without sockets: which thread does each work item, and in what order.

The host's socket thread does cheap work itself (a compiled launch, a parked launch whose
input it just stored) and leaves the rest to the dispatch thread; these tests play the
socket thread's part from the test's own thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pathways_nb.worker._executor import Executor
from pathways_nb.worker._store import ObjectStore

DEVICES = 2


def _double_plus_one(x: jax.Array) -> jax.Array:
    return 2 * x + 1


class _Host:
    """An executor and its store, driven the way the host's socket thread drives them."""

    def __init__(self) -> None:
        devices = jax.devices()[:DEVICES]
        self.sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
        self.store = ObjectStore()
        self.sent: list[dict[str, Any]] = []
        self.executor = Executor("h", devices, self.store, self.sent.append, window=4)
        self._lids = itertools.count(1)
        self._handles = itertools.count(100)
        self.executor.start()
        self.executor.serve_inline_from_this_thread()
        exp = export.export(jax.jit(_double_plus_one, out_shardings=self.sharding))(
            jax.ShapeDtypeStruct((8,), np.float32, sharding=self.sharding)
        )
        self.executor.submit("program", ("p", "double_plus_one", exp.serialize(), []))

    def value(self, start: float) -> jax.Array:
        return jax.device_put(np.arange(8, dtype=np.float32) + start, self.sharding)

    def arrive(self, handle: int, value: jax.Array) -> None:
        """An array arrives, as a put or a transfer does on the socket thread."""
        self.store.set(handle, value, value.nbytes, ("transfer", "other"), ready=True)

    def run(self, src: int) -> int:
        out = next(self._handles)
        body = {
            "lid": next(self._lids),
            "slice": "s",
            "pid": "p",
            "ins": [src],
            "outs": [out],
            "donate": [],
            "devices": list(range(DEVICES)),
            "mesh": [["x", DEVICES]],
            "name": "s",
        }
        self.executor.submit("run", body)
        return out

    def result(self, handle: int) -> np.ndarray:
        entry = self.store.wait(handle, 30.0)
        assert entry is not None, f"handle {handle} never appeared"
        return np.asarray(entry.value)

    def compiled(self) -> None:
        """Run the program once, so later launches find it compiled, and wait until the
        dispatch thread that compiled it is idle again."""
        self.arrive(1, self.value(0.0))
        self.result(self.run(1))
        ex = self.executor
        deadline = time.monotonic() + 30
        while ex._busy or ex._pending:
            assert time.monotonic() < deadline, "the dispatch thread never went idle"
            time.sleep(1e-3)

    def close(self) -> None:
        self.executor.stop()


@pytest.fixture
def host() -> Iterator[_Host]:
    h = _Host()
    h.compiled()
    yield h
    h.close()


def _expected(start: float) -> np.ndarray:
    return np.asarray(_double_plus_one(jnp.arange(8, dtype=jnp.float32) + start))


def test_an_arrival_on_the_socket_thread_resumes_the_parked_launch_there(host: _Host) -> None:
    out = host.run(7)  # its input has not arrived: parked
    assert host.store.get(out) is None
    assert any(m["t"] == "parked" for m in host.sent)
    host.arrive(7, host.value(3.0))
    host.executor.resume_due()
    # Dispatched before resume_due returned: nothing was handed to another thread.
    assert host.store.get(out) is not None
    np.testing.assert_array_equal(host.result(out), _expected(3.0))


def test_a_launch_beside_a_parked_one_runs_at_once_on_the_submitting_thread(
    host: _Host,
) -> None:
    host.run(7)  # parked
    host.arrive(8, host.value(1.0))
    out = host.run(8)  # touches nothing the parked launch does
    assert host.store.get(out) is not None
    np.testing.assert_array_equal(host.result(out), _expected(1.0))


def test_work_behind_a_parked_launch_waits_for_it_in_order(host: _Host) -> None:
    first = host.run(7)  # parked
    second = host.run(first)  # reads what the parked launch makes: parked behind it
    host.arrive(7, host.value(2.0))
    host.executor.resume_due()
    np.testing.assert_array_equal(
        host.result(second), np.asarray(_double_plus_one(jnp.asarray(_expected(2.0))))
    )


def test_without_room_in_the_window_the_dispatch_thread_resumes_it(
    host: _Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    outs = [host.run(7), host.run(7)]  # both parked on the same absent input
    ran_on: list[int] = []
    real = host.executor._run_planned

    def record(*args: Any, **kwargs: Any) -> None:
        ran_on.append(threading.get_ident())
        real(*args, **kwargs)

    monkeypatch.setattr(host.executor, "_run_planned", record)
    monkeypatch.setattr(host.executor.completions, "has_room", lambda: False)
    host.arrive(7, host.value(5.0))
    host.executor.resume_due()
    for out in outs:
        np.testing.assert_array_equal(host.result(out), _expected(5.0))
    # The socket thread must not wait for room: it left both, in order, to the other.
    assert len(ran_on) == 2 and threading.get_ident() not in ran_on


def test_an_arrival_stored_by_another_thread_wakes_the_dispatch_thread(host: _Host) -> None:
    out = host.run(7)
    other = threading.Thread(target=host.arrive, args=(7, host.value(4.0)))
    other.start()
    other.join()
    # Nobody calls resume_due: the dispatch thread was woken and ran it.
    np.testing.assert_array_equal(host.result(out), _expected(4.0))


def test_a_launch_that_compiles_reports_its_run_without_the_compile() -> None:
    """The ack's start and end feed the event log, the tenant's device seconds and the
    gang scheduler's cost estimate: a compile counted in made the program look a
    hundred times dearer, and a tenant charged at that price was starved."""
    h = _Host()
    try:
        compile_ = h.executor.programs.executable

        def slow_compile(*args: Any) -> Any:
            time.sleep(0.3)
            return compile_(*args)

        h.executor.programs.executable = slow_compile  # type: ignore[method-assign]
        h.arrive(1, h.value(0.0))
        began = time.time()
        np.testing.assert_array_equal(h.result(h.run(1)), _expected(0.0))
        deadline = time.monotonic() + 10
        while not [m for m in h.sent if m["t"] == "acks"]:
            assert time.monotonic() < deadline, "no acknowledgement"
            time.sleep(1e-3)
        ack = next(m for m in h.sent if m["t"] == "acks")["items"][0]
        _, start, end, err = ack[:4]
        assert err is None
        assert start >= began + 0.3  # it started once compiled...
        assert end - start < 0.2  # ...and ran for as long as running took
    finally:
        h.close()


def test_a_host_keeps_a_bounded_number_of_executables_least_recently_used_first() -> None:
    """A notebook that traces a new function per cell or per sweep value sends a new
    program each time: the host kept every executable (~0.2 MB each), without end."""
    from pathways_nb.worker._programs import Programs

    devices = jax.devices()[:DEVICES]
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    programs = Programs("h", devices, max_executables=2)
    aval = jax.ShapeDtypeStruct((8,), np.float32, sharding=sharding)
    for k in range(3):
        exp = export.export(jax.jit(lambda x, k=k: x * k, out_shardings=sharding))(aval)
        programs.add(f"p{k}", f"times{k}", exp.serialize())
    mesh = programs.mesh(range(DEVICES), [["x", DEVICES]])
    x = jax.device_put(np.arange(8, dtype=np.float32), sharding)
    for k in (0, 1, 0, 2):  # p0 used again, so p1 is the least recently used
        np.testing.assert_array_equal(
            np.asarray(programs.executable(f"p{k}", mesh, ())(x)), np.arange(8) * k
        )
    assert (programs.executables, programs.compiles) == (2, 3)
    programs.executable("p0", mesh, ())  # still kept: no compile
    assert programs.compiles == 3
    # The dropped one compiles again, from its program, which the host keeps.
    np.testing.assert_array_equal(np.asarray(programs.executable("p1", mesh, ())(x)), np.arange(8))
    assert (programs.executables, programs.compiles) == (2, 4)


def test_programs_come_and_probes_compile_on_a_thread_of_their_own_once() -> None:
    """A probe (a client's first call) is compiled off the dispatch thread, which may be
    busy: a launch of the same program that asks meanwhile waits for that compile, and
    a failed compile fails both."""
    import threading

    from pathways_nb.worker._programs import Programs

    devices = jax.devices()[:DEVICES]
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    programs = Programs("h", devices)
    aval = jax.ShapeDtypeStruct((8,), np.float32, sharding=sharding)
    # Flat outputs, as pw.jit exports them.
    exp = export.export(jax.jit(lambda x: [x + 1], out_shardings=[sharding]))(aval)
    programs.add_soon("p", "inc", exp.serialize()).result(30)
    mesh = programs.mesh(range(DEVICES), [["x", DEVICES]])
    replies: list[dict[str, Any]] = []
    got: list[Any] = []
    asked = threading.Thread(target=lambda: got.append(programs.executable("p", mesh, ())))
    programs.probe_soon(
        {"rid": 1, "pid": "p", "devices": list(range(DEVICES)), "mesh": [["x", DEVICES]]},
        replies.append,
    )
    asked.start()
    asked.join(30)
    programs.close()
    programs.close()  # safe twice
    assert replies == [{"t": "host_reply", "rid": 1, "out_specs": [["x"]]}]
    assert programs.compiles == 1 and programs.executables == 1
    x = jax.device_put(np.arange(8, dtype=np.float32), sharding)
    np.testing.assert_array_equal(np.asarray(got[0](x)[0]), np.arange(8) + 1)


def test_a_program_with_float0_outputs_fails_its_launches_and_the_host_serves_on(
    host: _Host,
) -> None:
    """XLA hands float0 outputs (the gradient of an integer input) back as NumPy
    arrays; a program exported with them, sent by anything but pw.jit (which leaves
    them out), once ended the host's threads when its launch finished."""

    def with_float0(x: jax.Array) -> tuple[jax.Array, Any]:
        return 2 * x, np.zeros((), jax.dtypes.float0)

    exp = export.export(jax.jit(with_float0, out_shardings=(host.sharding, None)))(
        jax.ShapeDtypeStruct((8,), np.float32, sharding=host.sharding)
    )
    host.executor.submit("program", ("q", "with_float0", exp.serialize(), []))
    host.arrive(2, host.value(1.0))
    out = next(host._handles)
    body = {
        "lid": next(host._lids),
        "slice": "s",
        "pid": "q",
        "ins": [2],
        "outs": [out, next(host._handles)],
        "donate": [],
        "devices": list(range(DEVICES)),
        "mesh": [["x", DEVICES]],
        "name": "s",
    }
    host.executor.submit("run", body)
    entry = host.store.wait(out, 30.0)
    assert entry is not None and entry.error is not None
    assert "returns float0 arrays (outputs [1])" in str(entry.error)
    np.testing.assert_array_equal(host.result(host.run(2)), _expected(1.0))
