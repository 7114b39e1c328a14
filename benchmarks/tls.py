"""What TLS costs: the same work on a cluster with TLS and on one without, side by side.

    python -m benchmarks.tls [--quick] [--json benchmarks/results/tls.json]

Two ``pw.LocalCluster`` s of two 2-device islands run at once, one started with
``security=True`` (every pathways link encrypted and mutually authenticated, as Dask's
own links are), one without; one client of each, and turns alternate between them:

- the round trip of a tiny program called and fetched;
- a put of a 64 MiB array sharded over an island's two devices, and its fetch (the bytes
  cross between the notebook and a host);
- the same array moved host to host to the other island's slice by the program that
  consumes it there.

Each ratio is the plain cluster's time over the TLS cluster's (1 = TLS costs nothing).
"""

from __future__ import annotations

import os

from benchmarks._common import with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(2)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Callable
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import alternating, big_array, machine, quick_main, summary


class _Side:
    """One cluster's client, slices and the timed operations on them."""

    def __init__(self, client: pw.Client, host_big: np.ndarray) -> None:
        self.a = client.allocate({"x": 2})
        self.b = client.allocate({"x": 2})
        self._host_big = host_big
        self._tiny = pw.jit(lambda v: v + 1.0, slice=self.a)
        self._one = self.a.put(np.ones(8, np.float32))
        self._moved = pw.jit(lambda v: v[:8, :8] * 2.0, slice=self.b, in_shardings=P("x"))
        self.big = self.a.put(host_big, P("x"))
        np.testing.assert_array_equal(self.big.fetch(), host_big)

    def round_trip(self) -> None:
        np.asarray(self._tiny(self._one))

    def put(self) -> None:
        self.a.put(self._host_big, P("x")).block_until_ready()

    def fetch(self) -> None:
        self.big.fetch()

    def transfer(self) -> None:
        # A fresh copy each turn: a consumed array is moved once, then kept there.
        self._moved(self.big * 1.0).block_until_ready()


def _turns(
    tls: Callable[[], Any], plain: Callable[[], Any], repeats: int, inner: int = 1
) -> dict[str, Any]:
    """Seconds per call of ``tls()`` and ``plain()`` (``inner`` calls a turn) in
    alternating turns, and the median of the paired ratios (plain over TLS)."""
    a, b, ratio = alternating(tls, plain, repeats, inner)
    return {"tls_s": summary(a), "plain_s": summary(b), "ratio": ratio}


def run(quick: bool = False) -> dict[str, Any]:
    big = (1 if quick else 64) << 20
    repeats = 3 if quick else 15
    inner = 10 if quick else 100
    host_big = big_array(big)
    with (
        pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False) as plain_cluster,
        pw.LocalCluster(
            islands=2, devices_per_island=2, dashboard=False, security=True
        ) as tls_cluster,
        pw.Client(plain_cluster) as plain_client,
        pw.Client(tls_cluster) as tls_client,
    ):
        assert tls_client.controller_address.startswith("tls://")
        plain, tls = _Side(plain_client, host_big), _Side(tls_client, host_big)
        result = {
            "round_trip": _turns(tls.round_trip, plain.round_trip, repeats, inner),
            "put_big": _turns(tls.put, plain.put, repeats),
            "fetch_big": _turns(tls.fetch, plain.fetch, repeats),
            "transfer_big": _turns(tls.transfer, plain.transfer, repeats),
        }
    return {
        "benchmark": "tls",
        "machine": machine(),
        "params": {"big_bytes": big, "repeats": repeats, "round_trips_per_turn": inner},
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    return quick_main(argv, __doc__, "tls", run)


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
