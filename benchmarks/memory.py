"""Resident memory of the controller and a host over a long run of programs.

    python -m benchmarks.memory [--programs 100000] [--json results/memory.json]

Runs ``--programs`` small chained programs (waiting on every 16th, as XLA's CPU
rendezvous needs) on a 4-device slice of a local cluster, deleting results as it goes,
and samples the resident set size of the scheduler process (the controller) and of
the worker process (the host) at the 10k-th program and at the end. The target: less
than 50 MB growth in each between those two points; the event log is a bounded ring.
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
from benchmarks._common import host_pids, machine, write


def rss_mb(p: psutil.Process) -> float:
    return float(p.memory_info().rss) / 2**20


def run(programs: int, checkpoint: int) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
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
    first, last = samples[0], samples[-1]
    growth = {k: last[k] - first[k] for k in ("controller", "host", "client")}
    return {
        "benchmark": "memory",
        "machine": machine(),
        "params": {"programs": programs, "checkpoint": checkpoint},
        "samples_mb": samples,
        "growth_mb": growth,
        "events_kept": stats.events_total,
        "target_growth_mb": 50,
        "targets_met": {k: v < 50 for k, v in growth.items() if k != "client"},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--programs", type=int, default=100_000)
    ap.add_argument("--checkpoint", type=int, default=10_000)
    ap.add_argument("--json", default="benchmarks/results/memory.json")
    args = ap.parse_args(argv)
    write(run(args.programs, args.checkpoint), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
