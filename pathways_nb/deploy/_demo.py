"""``pathways-nb demo``: train a small data-parallel MLP on a slice of a local cluster."""

from __future__ import annotations

import itertools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def init_params(sizes: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """He-initialised MLP parameters as NumPy arrays (identical on every side)."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        params[f"b{i}"] = np.zeros((b,), np.float32)
    return params


def make_data(n: int, d_in: int, d_out: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = rng.standard_normal((d_in, d_out)).astype(np.float32) / np.sqrt(d_in)
    y = np.sin(x @ w).astype(np.float32)
    return x, y


def mlp(params: dict[str, Any], x: Any) -> Any:
    n = len(params) // 2
    h = x
    for i in range(n):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = jax.nn.relu(h)
    return h


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    return jnp.mean((mlp(params, x) - y) ** 2)


def train_step(params: dict[str, Any], x: Any, y: Any, lr: float = 0.05) -> tuple[Any, Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return new, loss


def reference_losses(steps: int, sizes: tuple[int, ...], n: int) -> list[float]:
    """The same training in plain JAX in this process."""
    params = jax.tree.map(jnp.asarray, init_params(sizes))
    x, y = make_data(n, sizes[0], sizes[-1])
    step = jax.jit(train_step)
    out = []
    for _ in range(steps):
        params, loss = step(params, x, y)
        out.append(float(loss))
    return out


def run_demo(islands: int, devices: int, steps: int) -> dict[str, Any]:
    import pathways_nb as pw

    if not isinstance(steps, int) or steps < 1:
        # Before the cluster starts: the comparison with plain JAX needs a step to compare.
        raise ValueError(f"steps must be a whole number, 1 or more; got {steps!r}")
    sizes = (32, 128, 128, 8)
    n = 64 * devices
    t0 = time.perf_counter()
    with pw.LocalCluster(islands=islands, devices_per_island=devices) as cluster:
        print(f"started {cluster!r} in {time.perf_counter() - t0:.1f} s")
        with pw.Client(cluster) as client:
            vs = client.allocate({"data": devices}, name="train")
            print(f"allocated {vs!r}")
            x_np, y_np = make_data(n, sizes[0], sizes[-1])
            params = {k: vs.put(v, P()) for k, v in init_params(sizes).items()}
            x = vs.put(x_np, P("data"))
            y = vs.put(y_np, P("data"))
            step = pw.jit(train_step, donate_argnums=0)
            t1 = time.perf_counter()
            losses = []
            for _ in range(steps):
                params, loss = step(params, x, y)
                losses.append(loss)
            submitted = time.perf_counter() - t1
            values = [float(v) for v in pw.fetch(losses)]
            elapsed = time.perf_counter() - t1
            for i, v in enumerate(values):
                print(f"step {i:3d}  loss {v:.6f}")
            ref = reference_losses(steps, sizes, n)
            diff = max(abs(a - b) for a, b in zip(values, ref, strict=True))
            client.wait_all()
            ev = client.events()
            ran = ev[ev.kind == "end"].groupby(["program", "slice", "island", "host"]).size()
            print(
                f"\nsubmitted {steps} steps in {submitted * 1e3:.1f} ms; all done after "
                f"{elapsed * 1e3:.1f} ms"
            )
            print(f"where it ran (slice {vs.name} = devices {vs.devices} of {vs.island}):")
            print(ran.to_string())
            print(f"max |loss - plain JAX loss| over {steps} steps: {diff:.2e}")
            return {"losses": values, "reference": ref, "max_diff": diff}
