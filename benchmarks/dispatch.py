"""Dispatch (the paper's Fig. 5): one small 4-device program in three modes, for
pathways_nb, plain ``jax.jit`` and actor frameworks, side by side in one run.

    python -m benchmarks.dispatch [--quick] [--json benchmarks/results/dispatch.json]

- OpByOp: call, wait for the result, call again.
- Chained: N dependent calls submitted without waiting, except on every 16th result
  (plain JAX on CPU aborts with ~64 or more collective programs queued).
- Fused: the N steps compiled into one program (``lax.fori_loop``), called once.

The program is an all-reduce and an add over 4 simulated CPU devices. The actor columns
hold the same jitted function and fused program (``JaxActor``) in one process of their own
with 4 devices, and each call is a remote method call measured the same way in each:

- ``dask_actors``: a Dask actor on a one-worker ``LocalCluster``.
- ``ray_actors``: a Ray actor on a local ``ray.init`` (only when ``ray`` is installed).
- ``ipyparallel``: one engine of an ``ipyparallel.Cluster``, the actor in the engine's
  namespace, called through a DirectView (only when ``ipyparallel`` is installed).

Ray and ipyparallel come with ``pip install .[bench]``. A column whose package is missing,
or whose framework fails to start here, is listed under "skipped" with the reason; so are
both with ``--quick``, whose whole run takes less than starting them.
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib.util
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import Any

import numpy as np

import pathways_nb as pw
from benchmarks._common import WAIT_EVERY, chain, machine, quick_main, summary

SIZE = 4 * 256
ACTOR_CALLS = 320
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
    chain(call, x0, n)
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
    """The jitted step, the fused program and their state, held in another process with 4
    devices: a Dask actor on a worker, a Ray actor, or an object in an ipyparallel engine."""

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


# The actor's process gets its 4 simulated devices from these, set before it imports JAX.
ACTOR_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def _actor_rates(
    method: Callable[[str], Any], result: Callable[[Any], Any], n: int
) -> dict[str, float]:
    """Programs per second in each mode, for a ``JaxActor`` in another process:
    ``method(name)`` calls one of its methods remotely and returns a future, ``result``
    waits for that future. The same measurement for every actor framework.

    OpByOp and Chained make at most ``ACTOR_CALLS`` calls (a rate; actors take
    milliseconds per call, so more only lengthens the run); Fused runs the ``n`` steps
    the other systems run."""
    calls = min(n, ACTOR_CALLS)
    result(method("call"))
    result(method("wait"))
    result(method("fused"))
    out = {}
    result(method("reset"))
    t0 = time.perf_counter()
    for _ in range(calls):
        result(method("call"))
        result(method("wait"))
    out["opbyop"] = calls / (time.perf_counter() - t0)
    result(method("reset"))
    t0 = time.perf_counter()
    futures = []
    for i in range(calls):
        futures.append(method("call"))
        if i % WAIT_EVERY == WAIT_EVERY - 1:
            for fu in futures:
                result(fu)
            futures = []
            result(method("wait"))
    for fu in futures:
        result(fu)
    result(method("wait"))
    out["chained"] = calls / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    result(method("fused"))
    out["fused"] = n / (time.perf_counter() - t0)
    return out


def dask_actors(n: int) -> dict[str, float]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
            env=ACTOR_ENV,
        ) as cluster,
        Client(cluster) as dc,
    ):
        actor = dc.submit(JaxActor, n, actor=True).result()
        return _actor_rates(lambda name: getattr(actor, name)(), lambda fu: fu.result(), n)


def ray_actors(n: int, repeats: int) -> list[dict[str, float]]:
    """One Ray actor process on a local Ray instance, started once for all repeats (Ray
    takes ~20 s to start here) and shut down before returning."""
    import logging

    # Optional (the bench extra): typed when installed, missing in a plain test install.
    import ray

    try:  # a failed start may have left processes behind: shut down is safe either way
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        actor = ray.remote(JaxActor).options(runtime_env={"env_vars": ACTOR_ENV}).remote(n)
        return [
            _actor_rates(lambda name: getattr(actor, name).remote(), ray.get, n)
            for _ in range(repeats)
        ]
    finally:
        ray.shutdown()


def ipyparallel_engine(n: int, repeats: int) -> list[dict[str, float]]:
    """One ipyparallel engine (and its controller), started once for all repeats: the
    actor lives in the engine's namespace and each call applies a ``JaxActor`` method to
    it through a DirectView."""
    import logging

    # Optional (the bench extra), and untyped.
    import ipyparallel as ipp
    from traitlets.config import Config

    config = Config()
    config.EngineLauncher.environment = ACTOR_ENV
    cluster = ipp.Cluster(n=1, load_profile=False, config=config, log_level=logging.WARNING)
    try:
        rc = cluster.start_and_connect_sync()
        try:
            view = rc[0]
            view.execute(
                f"from benchmarks.dispatch import JaxActor\nactor = JaxActor({n})", block=True
            )
            actor = ipp.Reference("actor")
            return [
                _actor_rates(
                    lambda name: view.apply(getattr(JaxActor, name), actor),
                    lambda ar: ar.get(),
                    n,
                )
                for _ in range(repeats)
            ]
        finally:
            rc.close()
    finally:
        cluster.stop_cluster_sync()


# Optional columns: (package, column, measure(n, repeats)).
OPTIONAL: tuple[tuple[str, str, Callable[[int, int], list[dict[str, float]]]], ...] = (
    ("ray", "ray_actors", ray_actors),
    ("ipyparallel", "ipyparallel", ipyparallel_engine),
)


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
    skipped = {}
    for package, column, measure in OPTIONAL:
        if importlib.util.find_spec(package) is None:
            skipped[column] = "not installed (pip install .[bench])"
            continue
        if quick:
            # Starting Ray alone takes ~20 s here: more than --quick may spend on a column.
            skipped[column] = "not run with --quick (start-up too slow); the full run has it"
            continue
        try:
            samples[column] = measure(n, repeats)
        except Exception as e:  # an optional baseline that cannot run here is reported
            traceback.print_exc()  # in full on stderr; its last line in the JSON
            last = str(e).strip().splitlines()[-1:] or [""]
            skipped[column] = f"failed to run: {type(e).__name__}: {last[0]}"
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
    info = machine()
    info["versions"].update(
        {package: metadata.version(package) for package, column, _ in OPTIONAL if column in table}
    )
    return {
        "benchmark": "dispatch",
        "machine": info,
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
    with_hosts_allocator()
    raise SystemExit(main())
