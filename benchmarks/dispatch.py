"""Dispatch (the paper's Fig. 5): one small 4-device program in three modes, for
pathways_nb, plain ``jax.jit`` and Dask actors, side by side in one run.

    python -m benchmarks.dispatch [--quick] [--json benchmarks/results/dispatch.json]

- OpByOp: call, wait for the result, call again.
- Chained: N dependent calls submitted without waiting, except on every 16th result
  (plain JAX on CPU aborts with ~64 or more collective programs queued).
- Fused: the N steps compiled into one program (``lax.fori_loop``), called once.

The program is an all-reduce and an add over 4 simulated CPU devices. Dask actors hold
the same jitted function on a Dask worker with 4 devices; each call is an actor method
call. Ray and ipyparallel are listed under "skipped" with the reason.
"""

from __future__ import annotations

import os

from benchmarks._common import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pathways_nb as pw
from benchmarks._common import machine, quick_main, summary

SIZE = 4 * 256
WAIT_EVERY = 16
MODES = ("opbyop", "chained", "fused")


def step(x: Any) -> Any:
    import jax.numpy as jnp

    return x + jnp.sum(x) * 1e-6


def fused(n: int) -> Callable[[Any], Any]:
    from jax import lax

    def run(x: Any) -> Any:
        return lax.fori_loop(0, n, lambda _, v: step(v), x)

    return run


def _rates(
    call: Callable[[Any], Any], wait: Callable[[Any], Any], fused_call: Any, x0: Any, n: int
) -> dict[str, float]:
    """Programs per second in each mode, for one system's call/wait functions."""
    out = {}
    wait(call(x0))
    wait(fused_call(x0))
    t0 = time.perf_counter()
    x = x0
    for _ in range(n):
        x = wait(call(x))
    out["opbyop"] = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    x = x0
    for i in range(n):
        x = call(x)
        if i % WAIT_EVERY == WAIT_EVERY - 1:
            wait(x)
    wait(x)
    out["chained"] = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    wait(fused_call(x0))
    out["fused"] = n / (time.perf_counter() - t0)
    return out


def plain_jax(n: int) -> dict[str, float]:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sh = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), P("d"))
    f = jax.jit(step, out_shardings=sh)
    g = jax.jit(fused(n), out_shardings=sh)
    x0 = jax.device_put(np.ones(SIZE, np.float32), sh)
    return _rates(f, lambda v: v.block_until_ready(), g, x0, n)


def pathways(client: pw.Client, n: int) -> dict[str, float]:
    from jax.sharding import PartitionSpec as P

    vs = client.default_slice
    assert vs is not None
    f = pw.jit(step, out_shardings=P("d"))
    g = pw.jit(fused(n), out_shardings=P("d"), name="fused")
    x0 = vs.put(np.ones(SIZE, np.float32), P("d"))
    return _rates(f, lambda v: v.block_until_ready(), g, x0, n)


class JaxActor:
    """A Dask actor holding the jitted step and its state on a worker with 4 devices."""

    def __init__(self, n: int) -> None:
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        sh = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), P("d"))
        self.f = jax.jit(step, out_shardings=sh)
        self.g = jax.jit(fused(n), out_shardings=sh)
        self.x0 = jax.device_put(np.ones(SIZE, np.float32), sh)
        self.x = self.x0

    def reset(self) -> None:
        self.x = self.x0

    def call(self) -> None:
        self.x = self.f(self.x)

    def fused(self) -> None:
        self.g(self.x0).block_until_ready()

    def wait(self) -> None:
        self.x.block_until_ready()


def dask_actors(n: int) -> dict[str, float]:
    from distributed import Client, LocalCluster

    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
            env=env,
        ) as cluster,
        Client(cluster) as dc,
    ):
        actor = dc.submit(JaxActor, n, actor=True).result()
        actor.call().result()
        actor.wait().result()
        actor.fused().result()
        out = {}
        actor.reset().result()
        t0 = time.perf_counter()
        for _ in range(n):
            actor.call().result()
            actor.wait().result()
        out["opbyop"] = n / (time.perf_counter() - t0)
        actor.reset().result()
        t0 = time.perf_counter()
        futures = []
        for i in range(n):
            futures.append(actor.call())
            if i % WAIT_EVERY == WAIT_EVERY - 1:
                for fu in futures:
                    fu.result()
                futures = []
                actor.wait().result()
        for fu in futures:
            fu.result()
        actor.wait().result()
        out["chained"] = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        actor.fused().result()
        out["fused"] = n / (time.perf_counter() - t0)
    return out


def run(quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    n = 64 if quick else 1000
    repeats = repeats or (1 if quick else 3)
    samples: dict[str, list[dict[str, float]]] = {"pathways_nb": [], "jax": [], "dask_actors": []}
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        client.allocate({"d": 4})
        for _ in range(repeats):
            samples["jax"].append(plain_jax(n))
            samples["pathways_nb"].append(pathways(client, n))
    for _ in range(repeats):
        samples["dask_actors"].append(dask_actors(n))
    skipped = {
        name: (
            "not installed"
            if importlib.util.find_spec(name) is None
            else "installed, but this experiment has no column for it yet"
        )
        for name in ("ray", "ipyparallel")
    }
    table = {
        system: {mode: summary([s[mode] for s in runs]) for mode in MODES}
        for system, runs in samples.items()
    }
    ratios = {
        system: {
            mode: table[system][mode]["median"] / table["jax"][mode]["median"] for mode in MODES
        }
        for system in table
        if system != "jax"
    }
    return {
        "benchmark": "dispatch",
        "machine": machine(),
        "params": {"calls": n, "repeats": repeats, "size": SIZE, "wait_every": WAIT_EVERY},
        "programs_per_s": table,
        "ratio_to_jax": ratios,
        "skipped": skipped,
    }


def plot(result: dict[str, Any], path: str) -> None:
    from benchmarks._plot import grouped_bars

    table = result["programs_per_s"]
    grouped_bars(
        path,
        title="Dispatch (Fig. 5): programs per second, 4-device all-reduce + add",
        groups=list(MODES),
        series={s: [table[s][m]["median"] for m in MODES] for s in table},
        ylabel="programs / s (log)",
        log=True,
    )


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "dispatch", run, plot)


if __name__ == "__main__":
    raise SystemExit(main())
