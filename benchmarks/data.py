"""Feeding a slice from Dask: batches computed beside the host against batches brought
through the notebook, and against plain JAX fed by Dask in one process.

    python -m benchmarks.data [--quick] [--json benchmarks/results/data.json]

A Dask array of random rows (a stand-in for a dataset Dask reads: the values are made
by the Dask tasks, chunk by chunk) is walked a batch at a time, each batch sharded over
a 4-device slice and reduced by a small program there, the way a training loop consumes
it. Side by side in one run, taking turns:

- ``pw.data.batches``: each batch computed by the Dask worker that runs the slice's host
  and stored there in the same process, two batches ahead of the loop;
- through the client: each batch computed by the same Dask cluster, gathered into the
  notebook (``dask_client.compute(...).result()``), then ``vs.put`` to the host: the
  bytes cross two process boundaries;
- plain JAX: each batch computed by Dask's threads in this process and
  ``jax.device_put`` on 4 devices of this process, then the same reduction.

Reported: batches per second of each, and ``pw.data.batches`` over each of the others
(above 1 is faster). All of it shares this machine's cores.
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import time
from collections.abc import Callable
from typing import Any

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import machine, quick_main, summary

WIDTH = 1024


def _dataset(rows: int, batch: int) -> da.Array:
    rng = da.random.default_rng(0)
    return rng.standard_normal((rows, WIDTH), chunks=(batch, WIDTH), dtype=np.float32)


def run(quick: bool = False) -> dict[str, Any]:
    batch = 256 if quick else 4096  # 1 MiB or 16 MiB of float32 rows
    count = 4 if quick else 16
    rounds = 1 if quick else 5
    x = _dataset(batch * count, batch)
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    reduce_jax = jax.jit(lambda b: jnp.sum(b * b))
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"d": 4})
        reduce_ours = pw.jit(lambda b: jnp.sum(b * b))
        dask = client.dask_client

        def fed() -> float:
            outs = [reduce_ours(b) for b in pw.data.batches(x, vs, batch_size=batch)]
            return float(sum(float(o) for o in pw.fetch(outs)))

        def through_client() -> float:
            outs = []
            for i in range(count):
                rows = dask.compute(x[i * batch : (i + 1) * batch]).result()
                outs.append(reduce_ours(vs.put(rows, P("d"))))
            return float(sum(float(o) for o in pw.fetch(outs)))

        def plain_jax() -> float:
            outs = []
            for i in range(count):
                rows = x[i * batch : (i + 1) * batch].compute(scheduler="threads")
                outs.append(reduce_jax(jax.device_put(rows, sharding)))
            return float(sum(float(o) for o in jax.device_get(outs)))

        contenders: dict[str, Callable[[], float]] = {
            "pw_data_batches": fed,
            "through_client": through_client,
            "plain_jax": plain_jax,
        }
        # Every contender reduces the same rows to the same number (float32 sums
        # differ only by their order).
        sums = {name: f() for name, f in contenders.items()}
        first = sums["plain_jax"]
        assert all(abs(v - first) <= 1e-4 * abs(first) for v in sums.values()), sums
        seconds: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, f in contenders.items():
                t0 = time.perf_counter()
                f()
                seconds[name].append(time.perf_counter() - t0)
    rate = {name: count / statistics.median(s) for name, s in seconds.items()}
    return {
        "benchmark": "data",
        "machine": machine(),
        "params": {
            "batch_rows": batch,
            "batch_bytes": batch * WIDTH * 4,
            "batches": count,
            "rounds": rounds,
            "devices": 4,
        },
        "seconds_per_walk": {name: summary(s) for name, s in seconds.items()},
        "batches_per_s": rate,
        "vs_through_client": {"ratio": rate["pw_data_batches"] / rate["through_client"]},
        "vs_plain_jax": {"ratio": rate["pw_data_batches"] / rate["plain_jax"]},
    }


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "data", run)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
