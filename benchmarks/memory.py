"""Resident memory of the controller and a host over a long run of programs.

    python -m benchmarks.memory [--programs 100000] [--json results/memory.json]

Runs ``--programs`` small chained programs (waiting on every 16th, as XLA's CPU
rendezvous needs) on a 4-device slice of a local cluster, deleting results as it goes,
and samples the resident set size of the scheduler process (the controller) and of
the worker process (the host) at the 10k-th program and at the end. The target: less
than 50 MB growth in each between those two points; the event log is a bounded ring.

Then ``--distinct`` programs, each traced anew (a sweep making a new function per value,
as a notebook does): the host keeps its most recently used executables only
(PATHWAYS_HOST_EXECUTABLES, 256 by default), so from the half-way point on its memory
stays flat; without that bound each program kept ~0.26 MB.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time
from typing import Any

import jax.numpy as jnp
import numpy as np
import psutil
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import host_pids, machine, with_hosts_allocator, write


def rss_mb(p: psutil.Process) -> float:
    return float(p.memory_info().rss) / 2**20


def run(programs: int, checkpoint: int, distinct: int = 600) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
    distinct_samples: list[dict[str, float]] = []
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"d": 4})
        (host_pid,) = host_pids(client).values()
        procs = {
            "controller": psutil.Process(cluster.scheduler_pid),
            "host": psutil.Process(host_pid),
            "client": psutil.Process(),
        }
        step = pw.jit(lambda x: x * 0.999 + jnp.mean(x) * 0.001, out_shardings=P("d"))
        x = vs.put(np.ones(4096, np.float32), P("d"))
        t0 = time.perf_counter()
        for i in range(1, programs + 1):
            x = step(x)
            if i % 16 == 0:
                x.block_until_ready()
            if i in (checkpoint, programs):
                client.wait_all()
                time.sleep(0.5)  # let batched deletions reach the host
                samples.append(
                    {
                        "programs": i,
                        "seconds": time.perf_counter() - t0,
                        **{k: rss_mb(p) for k, p in procs.items()},
                    }
                )
        stats = client.status()
        t1 = time.perf_counter()
        for k in range(1, distinct + 1):
            swept = pw.jit(lambda a, k=k: jnp.sin(a) * k + jnp.cos(a) / k)
            y = swept(x)
            if k % 16 == 0:
                y.block_until_ready()
            if k in (distinct // 2, distinct):
                client.wait_all()
                distinct_samples.append(
                    {
                        "programs": k,
                        "seconds": time.perf_counter() - t1,
                        **{n: rss_mb(p) for n, p in procs.items() if n != "client"},
                    }
                )
    first, last = samples[0], samples[-1]
    growth = {k: last[k] - first[k] for k in ("controller", "host", "client")}
    out: dict[str, Any] = {
        "benchmark": "memory",
        "machine": machine(),
        "params": {"programs": programs, "checkpoint": checkpoint, "distinct": distinct},
        "samples_mb": samples,
        "growth_mb": growth,
        "events_kept": stats.events_total,
        "target_growth_mb": 50,
        "targets_met": {k: v < 50 for k, v in growth.items() if k != "client"},
    }
    if len(distinct_samples) == 2:
        a, b = distinct_samples
        out["distinct_programs"] = {
            "samples_mb": distinct_samples,
            "growth_mb": {n: b[n] - a[n] for n in ("controller", "host")},
            "programs_per_s": distinct / b["seconds"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--programs", type=int, default=100_000)
    ap.add_argument("--checkpoint", type=int, default=10_000)
    ap.add_argument(
        "--distinct", type=int, default=600, help="programs traced anew, one after another"
    )
    ap.add_argument("--json", default="benchmarks/results/memory.json")
    args = ap.parse_args(argv)
    write(run(args.programs, args.checkpoint, args.distinct), args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
