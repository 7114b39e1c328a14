"""The cost of watching: a training loop with the live widgets open against without.

    python -m benchmarks.widgets [--steps 300] [--repeats 7] [--json results/widgets.json]

A data-parallel MLP trains on a 4-device slice of a local cluster. Each repeat runs the
loop twice, back to back, which one first alternating: once plain, once with a live
timeline, status and placement widget refreshing on their own threads (as
``%pathways timeline``, ``status`` and ``devices`` leave them in a notebook). Outside a
kernel the widgets' messages go to a dummy comm; everything up to that (snapshots, event
log, intervals, serialization) runs. Target: the loop with widgets at >= 0.98x the loop without.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import time
from typing import Any

from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import machine, summary, with_hosts_allocator, write
from pathways_nb.deploy._demo import init_params, make_data, train_step

SIZES = (64, 256, 256, 8)


def loop(step: Any, params: Any, x: Any, y: Any, steps: int) -> tuple[Any, float]:
    t0 = time.perf_counter()
    loss: Any = None
    for i in range(steps):
        params, loss = step(params, x, y)
        if i % 16 == 15:
            loss.block_until_ready()
    float(loss)
    return params, steps / (time.perf_counter() - t0)


def run(steps: int, repeats: int) -> dict[str, Any]:
    plain: list[float] = []
    watched: list[float] = []
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"data": 4}, name="train")
        x_np, y_np = make_data(1024, SIZES[0], SIZES[-1])
        x, y = vs.put(x_np, P("data")), vs.put(y_np, P("data"))
        params = {k: vs.put(v, P()) for k, v in init_params(SIZES).items()}
        step = pw.jit(train_step, donate_argnums=0)
        params, _ = loop(step, params, x, y, 32)  # compile
        for r in range(repeats):
            # Alternate which loop goes first, so a machine that speeds up or slows down
            # during the run does not favour one side.
            for watching in (False, True) if r % 2 == 0 else (True, False):
                views = (
                    [
                        pw.viz.timeline(client, last=5.0),
                        pw.viz.status(client),
                        pw.viz.devices(client),
                    ]
                    if watching
                    else []
                )
                try:
                    params, rate = loop(step, params, x, y, steps)
                finally:
                    for v in views:
                        v.close()
                (watched if watching else plain).append(rate)
    # The median of per-repeat ratios: each pair ran back to back, under the same load.
    ratio = statistics.median(w / p for w, p in zip(watched, plain, strict=True))
    return {
        "benchmark": "widgets",
        "machine": machine(),
        "params": {"steps": steps, "repeats": repeats, "sizes": list(SIZES)},
        "plain_steps_per_s": summary(plain),
        "with_widgets_steps_per_s": summary(watched),
        "ratio": ratio,
        "target_ratio": 0.98,
        "targets_met": {"with_widgets_ge_0.98x": ratio >= 0.98},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default="benchmarks/results/widgets.json")
    args = ap.parse_args(argv)
    write(run(args.steps, args.repeats), args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
