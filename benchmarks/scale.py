"""Scale of the controller: cost per program as the cluster grows to 1,024 devices.

    python -m benchmarks.scale [--quick] [--json benchmarks/results/scale.json]

The controller under test is the real one (``pathways_nb.controller.Controller``) with its
real ROUTER sockets and loop thread, in this process, on ``tcp://127.0.0.1``. Everything
around it is a lean fake in ONE spawned process (one thread owns every socket):

- hosts: a DEALER each, registering as the real host does (8 devices, an island of its
  own, a ``process`` of its own as separate worker processes have). A host acknowledges
  every ``run`` of a received ``batch`` at once, in one ``acks`` message (100 µs of
  pretend device time), answers ``host_probe`` with a ``host_reply``, ignores the rest
  (``program``, ``drop``, ...) and beats every second like the real one. No JAX at all:
  128 real hosts (Dask workers) do not fit on two cores.
- tenants: raw protocol clients, a DEALER each, speaking what ``pw.Client`` sends —
  ``hello``, ``allocate``, ``program`` (the controller never parses the blob), ``put_note``
  and ``launch``/``delete`` in ``batch`` messages, with client-made handles and launch ids
  (tenant id in the high bits) — and honouring the client's ``max_queued`` back-pressure.
  The real client would need a host data plane for ``put``; the controller only ever
  sees the ``put_note``, so that is what the fakes send.

Why a separate process: the controller runs in the Dask scheduler's process when
deployed, and the fakes must not share its GIL; its thread's CPU time (read through
``time.pthread_getcpuclockid``) is then its own work alone.

Sweep: 8, 64, 256, 1,024 devices (1 to 128 hosts). Every island holds one 8-device
slice, the slices spread over ``min(hosts, 16)`` tenants, and 10^5 live remote arrays
(10^4 with ``--quick``) are registered at every point, so the sweep changes only the
cluster's size. A repeat submits the same number of launches at every point, round-robin
over tenants and their slices, each launch consuming the previous output of its slice
(chains: queues build up) and deleting it afterwards as ``x = f(x)`` does, 16 rounds per
batch message. Measured, each per program: wall seconds from the first submit until every
launch is acknowledged to its client (``done``); the controller thread's CPU seconds; and
this process's CPU seconds (that thread plus ZeroMQ's IO thread writing to more sockets).
The wall time includes the fakes (their own process, so on a busy two-core machine it
suffers from every other process too); the CPU figures do not. Target: wall cost per
program at 1,024 devices at most 2x that at 8; the controller thread's CPU likewise.
Also recorded per point, not per program: the round trip of one ``status`` request (what
live widgets poll), with the event log nearly empty and after the runs.

The sweep gives each island one tenant; many tenants' queues on one island are measured
on the gang scheduler alone (``tenants_on_one_island``: 1, 16, 128 and 1,024 tenants, µs
per launch with the window always full; target likewise at most 2x from 1 to 1,024).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import multiprocessing
import statistics
import threading
import time
from typing import Any

from benchmarks._common import machine, quick_main, summary, with_hosts_allocator
from benchmarks._scale_fakes import (
    DEVICES_PER_HOST,
    FAKE_DEVICE_SECONDS,
    ROUNDS_PER_BATCH,
    TIMEOUT,
    load_process,
)
from pathways_nb._core import Config
from pathways_nb.controller import Controller, GangScheduler, Work

MAX_TENANTS = 16
TARGET = 2.0
STATUS_SAMPLES = 5


class _Driver:
    """Runs the spawned load process and asks it for each step."""

    def __init__(self) -> None:
        mp = multiprocessing.get_context("spawn")  # never fork a process with threads
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=load_process, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def ask(self, cmd: str, arg: Any = None) -> Any:
        self.conn.send((cmd, arg))
        if not self.conn.poll(TIMEOUT + 10):
            raise TimeoutError(f"the load process did not answer {cmd!r}")
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"the load process failed at {cmd!r}:\n{value}")
        return value

    def close(self) -> None:
        # It may have ended already, after reporting an error.
        with contextlib.suppress(OSError):
            self.conn.send(("exit", None))
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _point(
    driver: _Driver, devices: int, live_arrays: int, launches: int, repeats: int
) -> dict[str, Any]:
    hosts = devices // DEVICES_PER_HOST
    tenants = min(hosts, MAX_TENANTS)
    config = Config()
    with Controller(config, bind_host="127.0.0.1") as ctl:
        thread = ctl._thread
        assert thread is not None
        t0 = time.perf_counter()
        info = driver.ask(
            "setup",
            {
                "client_address": ctl.client_address,
                "host_address": ctl.host_address,
                "hosts": hosts,
                "tenants": tenants,
                "live_arrays": live_arrays,
            },
        )
        setup_s = time.perf_counter() - t0
        status_fresh = driver.ask("status", STATUS_SAMPLES)
        # A short warm-up: the program reaches every host, the dicts reach their size.
        driver.ask("go", driver.ask("prepare", info["slices"] * ROUNDS_PER_BATCH))
        wall, cpu, process_cpu, load_cpu = [], [], [], []
        total = 0
        for _ in range(repeats):
            total = driver.ask("prepare", launches)
            c0, p0 = _thread_cpu(thread), time.process_time()
            seconds, load_seconds = driver.ask("go", total)
            cpu.append(1e6 * (_thread_cpu(thread) - c0) / total)
            # This thread only waits meanwhile: the rest is ZeroMQ's IO thread moving the
            # controller's bytes, a cost the loop thread's own clock does not see.
            process_cpu.append(1e6 * (time.process_time() - p0) / total)
            wall.append(1e6 * seconds / total)
            load_cpu.append(1e6 * load_seconds / total)
        status_full = driver.ask("status", STATUS_SAMPLES)
        stats = ctl.statistics()
        driver.ask("close")
    if stats.live_hosts != hosts or stats.launches_pending:
        raise RuntimeError(f"the controller ended the point in a bad state: {stats}")
    return {
        "devices": devices,
        "hosts": hosts,
        "tenants": tenants,
        "slices": info["slices"],
        "live_arrays": live_arrays,
        "controller_live_handles": stats.live_handles,
        "launches": total,
        "setup_s": setup_s,
        "us_per_program": summary(wall),
        "controller_cpu_us_per_program": summary(cpu),
        "controller_process_cpu_us_per_program": summary(process_cpu),
        "load_cpu_us_per_program": summary(load_cpu),
        # Not per program: one status snapshot, with the event log nearly empty and
        # after the runs (the log then holds three events per launch, up to its size).
        "status_ms": {
            "fresh_log": summary([1e3 * x for x in status_fresh]),
            "full_log": summary([1e3 * x for x in status_full]),
            "events_logged": stats.events,
        },
    }


def tenants_on_one_island(
    tenants: list[int], launches: int, repeats: int
) -> tuple[list[dict[str, Any]], float]:
    """The gang scheduler alone (its own state machine, no sockets): µs per launch with
    ``T`` tenants' queues on one island, each a few launches deep, the window always full:
    every completion dispatches the least advanced tenant's next launch and every tenant
    keeps submitting. The load the cluster sweep leaves out (one tenant per island).

    Each repeat measures every size back to back, with the garbage collector paused as
    ``timeit`` does, and the ratio (most tenants over one) is the median of the repeats'
    ratios: the machine's speed drifts more between repeats than within one.
    """
    lids = itertools.count(1)
    samples: dict[int, list[float]] = {n: [] for n in tenants}
    for _ in range(repeats):
        for n in tenants:
            s = GangScheduler(Config().inflight_window)
            s.add_island("i0", "p0")
            for t in range(1, n + 1):
                s.set_weight(t, 1.0 + t % 3)
                for _ in range(max(2, 4096 // n)):
                    s.submit(Work("run", t, "i0", next(lids), cost_key=f"k{t % 5}"))
            inflight = collections.deque(w.lid for w in s.dispatch())
            gc.disable()
            try:
                t0 = time.perf_counter()
                for i in range(launches):
                    s.complete(inflight.popleft(), 1e-3)
                    s.submit(Work("run", i % n + 1, "i0", next(lids), cost_key=f"k{i % 5}"))
                    inflight.extend(w.lid for w in s.dispatch())
                samples[n].append((time.perf_counter() - t0) / launches * 1e6)
            finally:
                gc.enable()
    first, last = samples[tenants[0]], samples[tenants[-1]]
    ratio = statistics.median(b / a for a, b in zip(first, last, strict=True))
    return [{"tenants": n, "us_per_launch": summary(samples[n])} for n in tenants], ratio


def run(quick: bool = False) -> dict[str, Any]:
    devices = [8, 64, 256, 1024]
    live_arrays = 10_000 if quick else 100_000
    launches = 4096 if quick else 32_768
    repeats = 1 if quick else 3
    driver = _Driver()
    try:
        points = [_point(driver, d, live_arrays, launches, repeats) for d in devices]
    finally:
        driver.close()
    first, last = points[0], points[-1]

    def ratio(key: str) -> float:
        return float(last[key]["median"] / first[key]["median"])

    r, rc = ratio("us_per_program"), ratio("controller_cpu_us_per_program")
    queues, rq = tenants_on_one_island(
        [1, 16, 128, 1024], 2000 if quick else 20_000, max(repeats, 5)
    )
    return {
        "benchmark": "scale",
        "machine": machine(),
        "params": {
            "devices": devices,
            "devices_per_host": DEVICES_PER_HOST,
            "max_tenants": MAX_TENANTS,
            "live_arrays": live_arrays,
            "live_arrays_scaling": "the same number at every point",
            "launches_per_repeat": launches,
            "rounds_per_batch": ROUNDS_PER_BATCH,
            "repeats": repeats,
            "inflight_window": Config().inflight_window,
            "fake_device_seconds": FAKE_DEVICE_SECONDS,
            "fakes": "fake hosts and raw tenants in one spawned process, tcp to the controller",
            "wall_includes": "the fakes (their own process); the controller CPU figures do not",
        },
        "points": points,
        "ratio_1024_vs_8": r,
        "controller_cpu_ratio_1024_vs_8": rc,
        "controller_process_cpu_ratio_1024_vs_8": ratio("controller_process_cpu_us_per_program"),
        "tenants_on_one_island": queues,
        "scheduler_ratio_1024_vs_1_tenants": rq,
        "target_ratio": TARGET,
        "targets_met": {
            "flat_cost_le_2x": r <= TARGET,
            "flat_controller_cpu_le_2x": rc <= TARGET,
            "flat_scheduler_cost_over_tenants_le_2x": rq <= TARGET,
        },
    }


def plot(result: dict[str, Any], path: str) -> None:
    from benchmarks._plot import lines

    pts = result["points"]
    lines(
        path,
        title="Controller cost per program vs cluster size",
        xs=[p["devices"] for p in pts],
        series={
            "wall time per program": [p["us_per_program"] for p in pts],
            "controller thread CPU per program": [p["controller_cpu_us_per_program"] for p in pts],
            "controller process CPU per program": [
                p["controller_process_cpu_us_per_program"] for p in pts
            ],
        },
        hlines={
            "target: 2x the wall time at 8 devices": TARGET * pts[0]["us_per_program"]["median"]
        },
        xlabel="simulated devices (8 per host, log)",
        ylabel="µs per program",
    )


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "scale", run, plot)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
