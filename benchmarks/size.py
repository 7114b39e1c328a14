"""Computation size at which pathways_nb matches plain JAX (the paper's Fig. 6).

    python -m benchmarks.size [--quick] [--json benchmarks/results/size.json]

A chain of dependent 4-device programs (a sharded matrix product and an all-reduce),
waiting on every 16th result, for a sweep of matrix sizes: the program's compute time
grows with the size while the dispatch cost stays. Reports calls per second for both
and the smallest size (and its compute time) where pathways_nb reaches 0.95x plain JAX.
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time
from typing import Any

import numpy as np

import pathways_nb as pw
from benchmarks._common import WAIT_EVERY, chain, machine, quick_main, summary

TARGET = 0.95


def program(x: Any) -> Any:
    import jax.numpy as jnp

    # Rows sharded over 4 devices; the product needs the whole matrix: an all-gather.
    return jnp.tanh(x @ x.T @ x) * (1.0 / x.shape[0])


def chained(f: Any, x0: Any, calls: int) -> float:
    f(x0).block_until_ready()
    t0 = time.perf_counter()
    chain(f, x0, calls)
    return calls / (time.perf_counter() - t0)


def run(quick: bool = False) -> dict[str, Any]:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sizes = [16, 64, 256] if quick else [16, 32, 64, 128, 256, 512, 1024]
    repeats = 1 if quick else 3
    sh = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), P("d"))
    ref = jax.jit(program, out_shardings=sh)
    rows: dict[str, Any] = {}
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"d": 4})
        ours = pw.jit(program, out_shardings=P("d"))
        for n in sizes:
            x = (np.eye(n, dtype=np.float32) + 0.01).astype(np.float32)
            calls = max(32, min(512, int(2e9 / (n**3 + 1e6))))
            calls -= calls % WAIT_EVERY
            jx, px = [], []
            xj = jax.device_put(x, sh)
            xp = vs.put(x, P("d"))
            for _ in range(repeats):
                jx.append(chained(ref, xj, calls))
                px.append(chained(ours, xp, calls))
            j, p = summary(jx), summary(px)
            rows[str(n)] = {
                "calls": calls,
                "program_ms": 1e3 / j["median"],
                "plain_jax_calls_per_s": j,
                "pathways_calls_per_s": p,
                "ratio": p["median"] / j["median"],
            }
    matched = [n for n in sizes if rows[str(n)]["ratio"] >= TARGET]
    first = matched[0] if matched else None
    return {
        "benchmark": "size",
        "machine": machine(),
        "params": {"sizes": sizes, "repeats": repeats, "wait_every": WAIT_EVERY},
        "sizes": rows,
        "smallest_matching_size": first,
        "smallest_matching_program_ms": rows[str(first)]["program_ms"] if first else None,
        "target_ratio": TARGET,
    }


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    ms = [rows[k]["program_ms"] for k in rows]
    ratio = [rows[k]["ratio"] for k in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ms, ratio, "o-", label="pathways_nb / plain JAX")
    ax.axhline(result["target_ratio"], color="grey", linestyle="--", label="0.95")
    ax.set_xscale("log")
    ax.set_xlabel("program time in plain JAX (ms, log)")
    ax.set_ylabel("throughput ratio")
    ax.set_title("Computation size needed to match plain JAX (Fig. 6)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "size", run, plot)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
