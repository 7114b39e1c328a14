"""A/B of two checkouts' controller and host on the chained all-reduce + add.

    python -m benchmarks.ab OTHER_CHECKOUT [--pairs 300] [--env KEY=VALUE ...]

This machine's speed drifts by tens of percent from one second to the next, so two
`benchmarks.core` runs cannot tell a 5% change from noise. Here one client process keeps
two ``pw.LocalCluster`` s up at once: A runs the controller and host of
``OTHER_CHECKOUT`` (a path to another checkout of pathways_nb), B those of this one
(with ``--env`` set in its processes only). Runs of 8 cycles of 16 chained calls
alternate between them, the order swapped from one pair to the next, and the result is
the median over pairs of B's cycle time over A's, with its quartiles. Both use this
checkout's client. ``OTHER_CHECKOUT`` equal to this one measures the method's own bias
(about 1% here).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import WAIT_EVERY, machine, with_hosts_allocator, write
from benchmarks.core import SIZE, allreduce_add

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = 8  # cycles per turn: one side's threads and caches stay warm within a turn


def cluster(checkout: str, env: dict[str, str]) -> pw.LocalCluster:
    """A one-island cluster whose processes import pathways_nb from ``checkout``
    (`python -m` puts its working directory first on the path: started from there)."""
    if not os.path.isdir(os.path.join(checkout, "pathways_nb")):
        raise SystemExit(f"{checkout!r} is not a checkout of pathways_nb (no pathways_nb/ in it)")
    with contextlib.chdir(checkout):
        return pw.LocalCluster(
            islands=1, devices_per_island=4, dashboard=False, env={"PYTHONPATH": checkout, **env}
        )


class Side:
    """A client on one cluster and the chain it runs."""

    def __init__(self, client: pw.Client) -> None:
        vs = client.allocate({"d": 4})
        self.f = pw.jit(allreduce_add, out_shardings=P("d"))
        self.x: Any = vs.put(np.ones(SIZE, np.float32), P("d"))

    def cycle(self) -> float:
        """Seconds for WAIT_EVERY chained calls and the wait on the last."""
        t0 = time.perf_counter()
        x = self.x
        for _ in range(WAIT_EVERY):
            x = self.f(x)
        x.block_until_ready()
        self.x = x
        return time.perf_counter() - t0


def run(other: str, pairs: int, env: dict[str, str]) -> dict[str, Any]:
    other = os.path.abspath(other)
    with cluster(other, {}) as ca, cluster(ROOT, env) as cb, pw.Client(ca) as a, pw.Client(cb) as b:
        sides = {"A": Side(a), "B": Side(b)}
        for s in sides.values():
            for _ in range(100):  # compile, connections, XLA's threads
                s.cycle()
        cycles: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(pairs):
            for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
                cycles[name].append(statistics.median(sides[name].cycle() for _ in range(RUN)))
    ratios = [tb / ta for ta, tb in zip(cycles["A"], cycles["B"], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return {
        "benchmark": "ab",
        "machine": machine(),
        "params": {"other": other, "this": ROOT, "pairs": pairs, "run": RUN, "env": env},
        "cycle_ms": {k: 1e3 * statistics.median(v) for k, v in cycles.items()},
        # B's cycle time over A's: below 1, B is faster.
        "b_over_a": {"median": median, "q1": q1, "q3": q3, "n": len(ratios)},
    }


def _env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env takes KEY=VALUE; got {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("other", help="path to the checkout to compare with (side A)")
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for B's processes")
    ap.add_argument("--json", default="benchmarks/results/ab.json")
    args = ap.parse_args(argv)
    if args.pairs < 4:
        raise SystemExit(f"--pairs must be at least 4 (quartiles need them); got {args.pairs}")
    write(run(args.other, args.pairs, _env(args.env)), args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
