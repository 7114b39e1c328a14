"""Core dispatch: pathways_nb against plain ``jax.jit`` on the same 4 simulated devices.

    python -m benchmarks.core [--calls 2000] [--repeats 3] [--json results/core.json]

Two measurements, each side by side in one run:

- round trip: a tiny program called and fetched one at a time (median per call);
- chained: N dependent calls of a 4-device all-reduce + add program, waiting on every
  16th result in both modes (plain JAX aborts here with ~64+ collective programs
  queued on CPU), reported as calls per second and as ours / plain JAX. Beside them,
  the same calls through a lean reference path (``benchmarks._lean``: a client, a
  controller and a host over ZeroMQ with nothing but the messages and the calls), which
  says what three Python processes reach here before a runtime adds anything. Then, in
  a run of its own, where a cycle of 16 chained calls goes (``chained.cycle_ms``: from
  the cycle's first call until the client has submitted them, the controller has the
  first launch, the host starts it, the host has seen the last finish and the client
  has the result; from the client's clock and the event log). Last, the chained ratio
  again from alternating turns of 8 cycles each (``chained.ratio_paired_turns``: median
  and quartiles over pairs): the runs above put seconds between the two sides, on a
  machine whose speed drifts meanwhile.
"""

from __future__ import annotations

import argparse
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import psutil
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import (
    WAIT_EVERY,
    chain,
    core_split,
    core_time,
    host_pids,
    machine,
    summary,
    timed,
    with_hosts_allocator,
    write,
)
from benchmarks._lean import LeanPath

SIZE = 4 * 256


def allreduce_add(x: jax.Array) -> jax.Array:
    return x + jnp.sum(x) * 1e-6


def tiny(x: jax.Array) -> jax.Array:
    return x + 1


Measured = tuple[float, float, dict[str, float], dict[str, dict[str, float]]]


def measure(
    f: Any, g: Any, x0: Any, calls: int, roundtrips: int, procs: dict[str, psutil.Process]
) -> Measured:
    """Seconds for ``calls`` chained calls of ``f``, per round trip of ``g``, and the CPU
    seconds per chained call that each process of ``procs`` spent meanwhile.

    The same code measures both sides: a RemoteArray answers ``block_until_ready`` and
    ``np.asarray`` as a ``jax.Array`` does.
    """
    f(x0).block_until_ready()
    np.asarray(g(x0))

    def chained() -> None:
        chain(f, x0, calls)

    def rt() -> None:
        for _ in range(roundtrips):
            np.asarray(g(x0))

    seconds, cpu, core = cpu_per_call(procs, lambda: timed(chained), calls)
    return seconds, timed(rt) / roundtrips, cpu, core


def cpu_per_call(
    procs: dict[str, psutil.Process], run: Any, calls: int
) -> tuple[float, dict[str, float], dict[str, dict[str, float]]]:
    """What ``run()`` returns (its seconds); the CPU seconds per call each process of
    ``procs`` spent meanwhile; and per call, the seconds its threads spent on a core and
    waiting for one (see :func:`core_split`)."""
    before = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
    cores = {k: core_split(p.pid) for k, p in procs.items()}
    seconds = run()
    cpu = {k: (sum(p.cpu_times()[:2]) - before[k]) / calls for k, p in procs.items()}
    core = {
        k: {f: v / calls for f, v in core_time(cores[k], core_split(p.pid)).items()}
        for k, p in procs.items()
    }
    return seconds, cpu, core


def plain_jax(calls: int, roundtrips: int, procs: dict[str, psutil.Process]) -> Measured:
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    sh = NamedSharding(mesh, P("d"))
    f = jax.jit(allreduce_add, out_shardings=sh)
    g = jax.jit(tiny, out_shardings=sh)
    return measure(f, g, jax.device_put(np.ones(SIZE, np.float32), sh), calls, roundtrips, procs)


def ours(
    client: pw.Client, calls: int, roundtrips: int, procs: dict[str, psutil.Process]
) -> Measured:
    vs = client.default_slice
    assert vs is not None
    f = pw.jit(allreduce_add, out_shardings=P("d"))
    g = pw.jit(tiny, out_shardings=P("d"))
    return measure(f, g, vs.put(np.ones(SIZE, np.float32), P("d")), calls, roundtrips, procs)


def cycle_legs(client: pw.Client, fn: Any, x0: Any, cycles: int) -> dict[str, float]:
    """Where a cycle of ``WAIT_EVERY`` chained calls of ``fn`` goes: median milliseconds
    from the cycle's first call until the client has submitted them all, the controller
    has the first launch, the host starts it, the host has seen the last one finish, and
    the client has the last result. From the client's clock and the event log (one
    machine, one clock), in a run of its own after the timed ones."""
    f = pw.jit(fn, out_shardings=P("d"))
    f(x0).block_until_ready()  # traced and compiled before the first cycle
    t_first = time.time()
    marks = []
    x = x0
    for _ in range(cycles):
        start = time.time()
        for _ in range(WAIT_EVERY):
            x = f(x)
        submitted = time.time()
        x.block_until_ready()
        marks.append((start, submitted, time.time()))
    client.wait_all()  # the last acknowledgements, which log the ends, follow the result
    ev = client.events(since=t_first)
    ev = ev[ev.program == fn.__name__]
    at = {
        kind: dict(zip(group.lid, group.time.astype("int64") / 1e9, strict=True))
        for kind, group in ev.groupby("kind")
    }
    launched, started, ended = (at.get(k, {}) for k in ("launch", "start", "end"))
    lids = sorted(launched)
    rows: list[list[float]] = []
    for c, (start, submitted, got) in enumerate(marks):
        cycle = lids[c * WAIT_EVERY : (c + 1) * WAIT_EVERY]
        if len(cycle) < WAIT_EVERY:
            break  # the event log lost some (it is a bounded ring)
        first, last = cycle[0], cycle[-1]
        if first in started and last in ended:
            times = (submitted, launched[first], started[first], ended[last], got)
            rows.append([t - start for t in times])
    if not rows:
        return {}
    names = (
        "submitted",
        "controller_has_first",
        "host_starts_first",
        "host_ends_last",
        "client_has_result",
    )
    columns = zip(*rows, strict=True)
    return {k: 1e3 * statistics.median(col) for k, col in zip(names, columns, strict=True)}


def paired(client: pw.Client, pairs: int) -> dict[str, float]:
    """Plain JAX and pathways_nb in alternating turns of 8 cycles of WAIT_EVERY chained
    calls (the order swapped each pair, as in ``benchmarks.ab``): the median over pairs
    of pathways_nb's calls per second over plain JAX's, with its quartiles. Turns a few
    milliseconds apart see the same machine, where whole runs a second apart do not."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    sh = NamedSharding(mesh, P("d"))
    fj = jax.jit(allreduce_add, out_shardings=sh)
    fp = pw.jit(allreduce_add, out_shardings=P("d"))
    vs = client.default_slice
    assert vs is not None
    state = {
        "plain_jax": (fj, jax.device_put(np.ones(SIZE, np.float32), sh)),
        "pathways": (fp, vs.put(np.ones(SIZE, np.float32), P("d"))),
    }

    def turn(side: str) -> float:
        f, x = state[side]
        seconds = []
        for _ in range(8):
            t0 = time.perf_counter()
            for _ in range(WAIT_EVERY):
                x = f(x)
            x.block_until_ready()
            seconds.append(time.perf_counter() - t0)
        state[side] = (f, x)
        return statistics.median(seconds)

    for side in state:
        turn(side)  # compiled, warm
    ratios = []
    for i in range(pairs):
        order = ("plain_jax", "pathways") if i % 2 == 0 else ("pathways", "plain_jax")
        took = {side: turn(side) for side in order}
        ratios.append(took["plain_jax"] / took["pathways"])
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return {"median": median, "q1": q1, "q3": q3, "pairs": pairs}


def lean(path: LeanPath, calls: int) -> tuple[float, dict[str, float], dict[str, dict[str, float]]]:
    """Calls per second through the lean reference path, and per call the CPU and core
    time of each of its processes (as :func:`cpu_per_call`)."""
    seconds, cpu, core = cpu_per_call(path.procs, lambda: path.chain(calls), calls)
    return calls / seconds, cpu, core


def run(calls: int, repeats: int, roundtrips: int) -> dict[str, Any]:
    jax_chain, jax_rt, pw_chain, pw_rt, lean_chain = [], [], [], [], []
    jax_cpu: list[dict[str, float]] = []
    pw_cpu: list[dict[str, float]] = []
    lean_cpu: list[dict[str, float]] = []
    cores: dict[str, list[dict[str, dict[str, float]]]] = {
        "plain_jax": [],
        "pathways": [],
        "lean_path": [],
    }
    path = LeanPath(allreduce_add, SIZE)
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        client.allocate({"d": 4})
        (host_pid,) = host_pids(client).values()
        procs = {
            "client": psutil.Process(),
            "controller": psutil.Process(cluster.scheduler_pid),
            "host": psutil.Process(host_pid),
        }
        for _ in range(repeats):
            c, r, cpu, core = plain_jax(calls, roundtrips, procs)
            jax_chain.append(calls / c)
            jax_rt.append(r)
            jax_cpu.append(cpu)
            cores["plain_jax"].append(core)
            c, r, cpu, core = ours(client, calls, roundtrips, procs)
            pw_chain.append(calls / c)
            pw_rt.append(r)
            pw_cpu.append(cpu)
            cores["pathways"].append(core)
            rate, cpu, core = lean(path, calls)
            lean_chain.append(rate)
            lean_cpu.append(cpu)
            cores["lean_path"].append(core)
        vs = client.default_slice
        assert vs is not None
        x0 = vs.put(np.ones(SIZE, np.float32), P("d"))
        legs = cycle_legs(client, allreduce_add, x0, max(4, calls // WAIT_EVERY // 2))
        turns = paired(client, max(8, calls // WAIT_EVERY // 4))
    path.close()
    chained: dict[str, Any] = {
        "plain_jax_calls_per_s": summary(jax_chain),
        "pathways_calls_per_s": summary(pw_chain),
        "lean_path_calls_per_s": summary(lean_chain),
    }
    jax_median = chained["plain_jax_calls_per_s"]["median"]
    chained["ratio"] = chained["pathways_calls_per_s"]["median"] / jax_median
    chained["lean_path_ratio"] = chained["lean_path_calls_per_s"]["median"] / jax_median
    # The same ratio from alternating turns (see paired): beside the runs above, whose
    # two sides run seconds apart on a machine whose speed drifts meanwhile.
    chained["ratio_paired_turns"] = turns
    chained["target_ratio"] = 0.7
    # Where the time goes: CPU microseconds per chained call in each process (median).
    chained["cpu_us_per_call"] = {
        side: {k: 1e6 * statistics.median(c[k] for c in runs) for k in procs}
        for side, runs in (("plain_jax", jax_cpu), ("pathways", pw_cpu), ("lean_path", lean_cpu))
    }
    # The machine's core time per call (its cores times the wall time per call, at the
    # median rate) against what each process's threads spent on a core and waiting for
    # one (``*_niced``: threads at a raised nice value, XLA's on hosts), medians in µs.
    rates = {"plain_jax": jax_median, "pathways": chained["pathways_calls_per_s"]["median"]}
    rates["lean_path"] = chained["lean_path_calls_per_s"]["median"]
    ncores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    chained["core_us_per_call"] = {
        side: {
            "machine": 1e6 * (ncores or 1) / rates[side],
            **{
                proc: {
                    f: 1e6 * statistics.median(run[proc][f] for run in runs) for f in runs[0][proc]
                }
                for proc in runs[0]
            },
        }
        for side, runs in cores.items()
    }
    # And where a cycle of WAIT_EVERY calls goes (ms from its first call), beside plain
    # JAX's whole cycle at its median rate.
    chained["cycle_ms"] = dict(legs, plain_jax=1e3 * WAIT_EVERY / jax_median)
    roundtrip: dict[str, Any] = {"plain_jax_s": summary(jax_rt), "pathways_s": summary(pw_rt)}
    roundtrip["ratio"] = roundtrip["pathways_s"]["median"] / roundtrip["plain_jax_s"]["median"]
    roundtrip["target_pathways_s"] = 1e-3
    return {
        "benchmark": "core",
        "machine": machine(),
        "params": {
            "calls": calls,
            "repeats": repeats,
            "roundtrips": roundtrips,
            "size": SIZE,
            "wait_every": WAIT_EVERY,
        },
        "chained": chained,
        "roundtrip": roundtrip,
        "targets_met": {
            "chained_ge_0.7x": chained["ratio"] >= 0.7,
            "roundtrip_lt_1ms": roundtrip["pathways_s"]["median"] < 1e-3,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--roundtrips", type=int, default=200)
    ap.add_argument("--json", default="benchmarks/results/core.json")
    args = ap.parse_args(argv)
    write(run(args.calls, args.repeats, args.roundtrips), args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
