"""Moving arrays between the notebook and a slice, against plain JAX on the same devices.

    python -m benchmarks.fetch [--quick] [--json benchmarks/results/fetch.json]

Side by side in one run, alternating turns, on one 4-device host (a ``pw.LocalCluster``)
and on 4 devices of this process (plain JAX):

- a pytree of 1,000 small arrays (replicated, 8 floats each), as model parameters or a
  dict of metrics are: ``pw.fetch(tree)`` against ``jax.device_get(tree)``, and
  ``pw.block_until_ready(tree)`` against ``jax.block_until_ready(tree)``;
- one 64 MiB array sharded over the 4 devices: ``vs.put`` against ``jax.device_put``,
  and ``x.fetch()`` against ``np.asarray`` of the ``jax.Array``. Plain JAX on CPU devices
  copies within one process; pathways_nb sends the bytes to another process and back.
- the same array checkpointed to a ``.npy`` file and read back: ``pw.save`` (the host
  writes it) against ``np.save`` of ``np.asarray`` of the ``jax.Array``, and
  ``pw.restore`` (the host reads it) against ``jax.device_put(np.load(...))``. Both write
  to the same disk; pathways_nb's bytes never reach the notebook. ``pw.save(...,
  wait=False)`` is timed until the notebook may go on (the array copied on its host;
  the file is written meanwhile, and waited for untimed before the next turn).

A ``jax.Array`` keeps the NumPy value it was read as, so every plain-JAX turn reads
arrays never read before (made before the timing starts).

Each ratio is plain JAX's time over pathways_nb's (1 = as fast as plain JAX).
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import alternating, big_array, machine, quick_main, summary


def _turns(
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    repeats: int,
    after: Callable[[], Any] = lambda: None,
) -> dict[str, Any]:
    """Seconds of ``ours()`` and ``theirs()`` in alternating turns, and the median of
    the paired ratios (theirs over ours); ``after()``, untimed, follows each of ours."""
    a, b, ratio = alternating(ours, theirs, repeats, after=after)
    return {"pathways_s": summary(a), "plain_jax_s": summary(b), "ratio": ratio}


def run(quick: bool = False) -> dict[str, Any]:
    leaves = 100 if quick else 1000
    big = (1 if quick else 64) << 20
    repeats = 3 if quick else 15
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    host_big = big_array(big)
    small = [np.full(8, i, np.float32) for i in range(leaves)]
    with (
        pw.LocalCluster(islands=1, devices_per_island=4, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        vs = client.allocate({"d": 4})
        ours_tree = {"p": [vs.put(v) for v in small]}
        jax_tree = {"p": [jax.device_put(v, NamedSharding(mesh, P())) for v in small]}
        ours_big = vs.put(host_big, P("d"))
        unread_trees = [
            {"p": [jax.device_put(v, NamedSharding(mesh, P())) for v in small]}
            for _ in range(repeats + 1)
        ]
        unread_big = [
            jax.device_put(host_big, NamedSharding(mesh, P("d"))) for _ in range(repeats + 1)
        ]
        got = pw.fetch(ours_tree)
        assert all(float(g[0]) == i for i, g in enumerate(got["p"]))
        np.testing.assert_array_equal(ours_big.fetch(), host_big)

        def put_ours() -> None:
            vs.put(host_big, P("d")).block_until_ready()

        def put_jax() -> None:
            jax.device_put(host_big, NamedSharding(mesh, P("d"))).block_until_ready()

        folder = tempfile.mkdtemp(prefix="pathways-bench-ckpt-")
        sharding = NamedSharding(mesh, P("d"))

        def save_ours() -> None:
            pw.save(os.path.join(folder, "ours"), {"w": ours_big})

        def save_jax() -> None:
            os.makedirs(os.path.join(folder, "jax"), exist_ok=True)
            np.save(os.path.join(folder, "jax", "w.npy"), np.asarray(unread_saves.pop()))

        def restore_ours() -> None:
            pw.restore(os.path.join(folder, "ours"), {"w": ours_big})["w"].delete()

        def restore_jax() -> None:
            path = os.path.join(folder, "jax", "w.npy")
            jax.device_put(np.load(path), sharding).block_until_ready()

        def save_background() -> None:
            # Timed until the notebook may go on: the arrays copied on their host.
            pending.append(pw.save(os.path.join(folder, "bg"), {"w": ours_big}, wait=False))

        def written() -> None:
            while pending:
                pending.pop().result()

        pending: list[pw.client.Saving] = []
        unread_saves = [jax.device_put(host_big, sharding) for _ in range(2 * repeats + 2)]
        result = {
            "save_big": _turns(save_ours, save_jax, repeats),
            "save_background_big": _turns(save_background, save_jax, repeats, after=written),
            "restore_big": _turns(restore_ours, restore_jax, repeats),
        }
        back = pw.restore(os.path.join(folder, "ours"), {"w": ours_big})["w"]
        np.testing.assert_array_equal(back.fetch(), host_big)
        shutil.rmtree(folder, ignore_errors=True)
        result |= {
            "fetch_pytree": _turns(
                lambda: pw.fetch(ours_tree), lambda: jax.device_get(unread_trees.pop()), repeats
            ),
            "wait_pytree": _turns(
                lambda: pw.block_until_ready(ours_tree),
                lambda: jax.block_until_ready(jax_tree),
                repeats,
            ),
            "put_big": _turns(put_ours, put_jax, repeats),
            "fetch_big": _turns(ours_big.fetch, lambda: np.asarray(unread_big.pop()), repeats),
        }
    return {
        "benchmark": "fetch",
        "machine": machine(),
        "params": {"leaves": leaves, "leaf_shape": [8], "big_bytes": big, "repeats": repeats},
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "fetch", run)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
