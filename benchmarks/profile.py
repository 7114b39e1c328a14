"""What profiling the hosts costs: chained calls with XLA's profiler on and off, in turns.

    python -m benchmarks.profile [--quick] [--json benchmarks/results/profile.json]

One ``pw.LocalCluster`` island of 4 devices runs the core benchmark's chain (a 4-device
all-reduce + add, every 16th result waited on) in alternating turns: one under
``client.profile`` (the chain timed between the profile's start and its stop), one
without. Also reported: the seconds a stop takes (XLA writes its files and the host sends
its Perfetto trace back) and XLA's events per call. The ratio is the profiled rate over
the unprofiled one (1 = profiling costs nothing).
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import chain, machine, quick_main, summary


def _step(x: jax.Array) -> jax.Array:
    return x + 1e-3 * jnp.sum(x, axis=0, keepdims=True)


def run(quick: bool = False) -> dict[str, Any]:
    calls = 160 if quick else 1600
    repeats = 2 if quick else 6
    plain: list[float] = []
    profiled: list[float] = []
    stops: list[float] = []
    events: list[int] = []
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
        tempfile.TemporaryDirectory() as folder,
    ):
        vs = client.allocate({"x": 4})
        x = vs.put(np.ones((4, 256), np.float32), P("x"))
        f = pw.jit(_step, name="chain")
        chain(f, x, 32)  # compiled, and the hosts' threads awake
        for turn in range(repeats):
            t0 = time.perf_counter()
            chain(f, x, calls)
            plain.append(calls / (time.perf_counter() - t0))
            prof = client.profile(os.path.join(folder, str(turn))).start()
            t0 = time.perf_counter()
            chain(f, x, calls)
            profiled.append(calls / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            prof.stop()
            stops.append(time.perf_counter() - t0)
            events.append(sum(len(t.events) for t in prof.hosts))
    return {
        "benchmark": "profile",
        "machine": machine(),
        "params": {"calls_per_turn": calls, "turns": repeats},
        "calls_per_s": {"profiled": summary(profiled), "plain": summary(plain)},
        "ratio": statistics.median(p / q for p, q in zip(profiled, plain, strict=True)),
        "stop_s": summary(stops),
        "xla_events_per_call": statistics.median(events) / calls,
    }


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "profile", run)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
