"""The cost of watching: a training loop with the live widgets open, or JupyterLab's
Pathways panel, against neither.

    python -m benchmarks.widgets [--steps 300] [--repeats 7] [--json results/widgets.json]

A data-parallel MLP trains on a 4-device slice of a local cluster. Each repeat runs the
loop three times, back to back, in an order that turns from one repeat to the next: once
plain; once with a live timeline, status and placement widget refreshing on their own
threads (as ``%pathways timeline``, ``status`` and ``devices`` leave them in a notebook;
outside a kernel their messages go to a dummy comm, and everything up to that runs);
once with the panel open: another process polls the cluster as the Jupyter server does
for an open panel (an observer client's status and event log, once a second, turned into
the panel's tables, placement and timeline). Targets: the loop with widgets, and with
the panel, at >= 0.98x the loop without.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import multiprocessing
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


def poll_as_the_panel(address: str, stop: Any, polled: Any) -> None:
    """What the Jupyter server does while a panel shows the cluster at ``address``."""
    from pathways_nb.lab._boards import Boards

    boards = Boards()
    board = boards.board(address)
    try:
        while not stop.is_set():
            snap = board.snapshot()
            if "error" in snap:
                raise RuntimeError(snap["error"])
            polled.value += 1
            stop.wait(1.0)  # the panel's refresh interval
    finally:
        boards.close()


class _Panel:
    """A process polling as an open panel does, from start to close."""

    def __init__(self, address: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.polled = ctx.Event(), ctx.Value("i", 0)
        self.proc = ctx.Process(target=poll_as_the_panel, args=(address, self.stop, self.polled))
        self.proc.start()
        deadline = time.monotonic() + 60
        while self.polled.value == 0:  # connected, and drawn once
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the panel's poller did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.proc.join(30)
        if self.proc.exitcode != 0:
            raise RuntimeError(f"the panel's poller failed (exit code {self.proc.exitcode})")


def run(steps: int, repeats: int) -> dict[str, Any]:
    plain: list[float] = []
    watched: list[float] = []
    paneled: list[float] = []
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
        sides = ["plain", "widgets", "panel"]
        for r in range(repeats):
            # Turn the order, so a machine that speeds up or slows down during the run
            # does not favour one side.
            for side in sides[r % 3 :] + sides[: r % 3]:
                views: list[Any] = []
                if side == "widgets":
                    views = [
                        pw.viz.timeline(client, last=5.0),
                        pw.viz.status(client),
                        pw.viz.devices(client),
                    ]
                elif side == "panel":
                    views = [_Panel(cluster.scheduler_address)]
                try:
                    params, rate = loop(step, params, x, y, steps)
                finally:
                    for v in views:
                        v.close()
                {"plain": plain, "widgets": watched, "panel": paneled}[side].append(rate)
    # The median of per-repeat ratios: each repeat's loops ran back to back, under the
    # same load.
    ratio = statistics.median(w / p for w, p in zip(watched, plain, strict=True))
    panel_ratio = statistics.median(w / p for w, p in zip(paneled, plain, strict=True))
    return {
        "benchmark": "widgets",
        "machine": machine(),
        "params": {"steps": steps, "repeats": repeats, "sizes": list(SIZES)},
        "plain_steps_per_s": summary(plain),
        "with_widgets_steps_per_s": summary(watched),
        "with_panel_steps_per_s": summary(paneled),
        "ratio": ratio,
        "panel_ratio": panel_ratio,
        "target_ratio": 0.98,
        "targets_met": {
            "with_widgets_ge_0.98x": ratio >= 0.98,
            "with_panel_ge_0.98x": panel_ratio >= 0.98,
        },
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
