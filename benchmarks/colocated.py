"""What ``pw.colocated`` costs, and what it saves: Python on the host beside the devices.

    python -m benchmarks.colocated [--quick] [--json benchmarks/results/colocated.json]

One ``pw.LocalCluster`` island of 4 devices; turns alternate between the two sides of
each comparison:

- the round trip of a colocated function returning a small array (NumPy on the host),
  against a ``pw.jit`` program doing the same, each called and fetched;
- a statistic NumPy has and XLA has not (the 1st and 99th percentiles) of a 64 MiB array
  sharded over the island: computed on its host by a colocated function, its 8 bytes
  fetched, against fetching the array into the notebook and computing it there; and,
  beside them, plain JAX in one process (``np.percentile`` of a ``jax.Array`` on 4 of its
  own devices), which moves no bytes between processes.

Each ratio is the other side's time over the colocated side's (above 1: colocated is
faster), as the other benchmarks give the baseline's time over pathways_nb's.
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import alternating, big_array, machine, quick_main, summary, timed


def _tails(v: Any) -> np.ndarray:
    return np.percentile(np.asarray(v), [1.0, 99.0]).astype(np.float32)


def run(quick: bool = False) -> dict[str, Any]:
    big = (1 if quick else 64) << 20
    repeats = 3 if quick else 15
    inner = 10 if quick else 100
    value = big_array(big)
    want = _tails(value)
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"x": 4})
        small = vs.put(np.ones(8, np.float32))
        jitted = pw.jit(lambda v: v + 1.0)
        plus = pw.colocated(lambda v: np.asarray(v) + 1.0, out=lambda v: v)
        x = vs.put(value, P("x"))
        tails = pw.colocated(_tails, out=jax.ShapeDtypeStruct((2,), np.float32))
        np.testing.assert_array_equal(tails(x).fetch(), want)
        np.testing.assert_array_equal(_tails(x.fetch()), want)
        # Ratios are the other side's time over the colocated side's, as the other
        # benchmarks' are the baseline's over pathways_nb's.
        colo_rt, jit_rt, rt_ratio = alternating(
            lambda: np.asarray(plus(small)), lambda: np.asarray(jitted(small)), repeats, inner
        )
        colo_big, fetched_big, big_ratio = alternating(
            lambda: tails(x).fetch(), lambda: _tails(x.fetch()), repeats
        )
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    local = jax.device_put(value, NamedSharding(mesh, P("x")))
    _tails(local)
    jax_s = [timed(lambda: _tails(local)) for _ in range(repeats)]
    return {
        "benchmark": "colocated",
        "machine": machine(),
        "params": {"big_bytes": big, "repeats": repeats, "round_trips_per_turn": inner},
        "round_trip": {
            "jit_s": summary(jit_rt),
            "colocated_s": summary(colo_rt),
            "ratio": rt_ratio,
        },
        "tails_big": {
            "fetched_s": summary(fetched_big),
            "colocated_s": summary(colo_big),
            "ratio": big_ratio,
            "plain_jax_s": summary(jax_s),
        },
    }


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "colocated", run)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
