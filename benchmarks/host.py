"""A host on its own: the chained calls fed straight to a host's executor in this
process, beside the same program run by plain ``jax.jit`` on the same devices.

    python -m benchmarks.host [--calls 3000] [--pairs 6] [--json benchmarks/results/host.json]

The executor, its object store and its completion thread run as in a worker, with no
client, controller or socket: this thread hands it each launch as the host's socket
thread does, and waits on every 16th result through the host's acknowledgements. Set
beside ``benchmarks.core``'s whole path and its lean path, it says how much of the
chained calls' gap lies in the host's own work per launch and how much between the
processes. XLA's threads are lowered as a worker lowers them (both sides share
this process, so both run that way). The two sides alternate, ``pairs`` times.
"""

from __future__ import annotations

import os

from benchmarks._common import WAIT_EVERY, with_hosts_allocator, xla_flags

os.environ["XLA_FLAGS"] = xla_flags(4)  # before JAX is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import threading
import time
from typing import Any

import jax
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks._common import chain, machine, summary, timed, write
from benchmarks.core import SIZE, allreduce_add
from pathways_nb._core import Config
from pathways_nb.worker._executor import Executor
from pathways_nb.worker._priority import lower_native_threads
from pathways_nb.worker._store import ObjectStore


class _FedHost:
    """An executor fed launch messages by the calling thread."""

    def __init__(self, devices: list[jax.Device], sharding: NamedSharding) -> None:
        spec = jax.ShapeDtypeStruct((SIZE,), np.float32, sharding=sharding)
        blob = export.export(jax.jit(allreduce_add, in_shardings=sharding, out_shardings=sharding))(
            spec
        ).serialize()
        self._acked: set[int] = set()
        self._cv = threading.Condition()
        self.store = ObjectStore()
        self.executor = Executor("host", devices, self.store, self._send, window=WAIT_EVERY)
        self.executor.start()
        self.executor.submit("program", ("p", "allreduce_add", bytes(blob), [["d"]]))
        self.store.set(1, jax.device_put(np.ones(SIZE, np.float32), sharding), 4 * SIZE, ready=True)
        self._devices = [int(d.id) for d in devices]
        self._next = 2

    def _send(self, msg: dict[str, Any]) -> None:
        if msg.get("t") == "acks":
            with self._cv:
                self._acked.update(int(item[0]) for item in msg["items"])
                self._cv.notify_all()

    def _wait(self, lid: int) -> None:
        # The host's socket thread records what XLA finished before it polls again.
        self.executor.completions.reap()
        with self._cv:
            while lid not in self._acked:
                self._cv.wait()
            self._acked.clear()

    def chain(self, calls: int) -> float:
        """Seconds for ``calls`` chained launches, waiting on every ``WAIT_EVERY``-th."""
        t0 = time.perf_counter()
        x = 1
        for i in range(calls):
            y, self._next = self._next, self._next + 1
            self.executor.submit(
                "run",
                {
                    "t": "run",
                    "lid": y,
                    "slice": 1,
                    "pid": "p",
                    "ins": [x],
                    "outs": [y],
                    "donate": [],
                    "devices": self._devices,
                    "mesh": [["d", len(self._devices)]],
                    "name": "s",
                },
            )
            if x != 1:
                self.executor.submit("drop", [x])
            if i % WAIT_EVERY == WAIT_EVERY - 1 or i == calls - 1:
                self._wait(y)
            x = y
        return time.perf_counter() - t0

    def close(self) -> None:
        self.executor.stop()


def run(calls: int, pairs: int) -> dict[str, Any]:
    devices = jax.devices()[:4]
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P("d"))
    host = _FedHost(devices, sharding)
    f = jax.jit(allreduce_add, out_shardings=sharding)
    x0 = jax.device_put(np.ones(SIZE, np.float32), sharding)

    def plain() -> float:
        return timed(lambda: chain(f, x0, calls))

    host.chain(300)
    plain()
    c = Config()  # as a worker does, once XLA has started its threads
    lowered = lower_native_threads(c.cpu_device_nice, c.cpu_device_spread, c.cpu_device_idle)
    ours_rate, plain_rate, ratios = [], [], []
    try:
        for _ in range(pairs):
            a = calls / host.chain(calls)
            b = calls / plain()
            ours_rate.append(a)
            plain_rate.append(b)
            ratios.append(a / b)
    finally:
        host.close()
    return {
        "benchmark": "host",
        "machine": machine(),
        "params": {"calls": calls, "pairs": pairs, "size": SIZE, "wait_every": WAIT_EVERY},
        "xla_threads_lowered": lowered,
        "host_calls_per_s": summary(ours_rate),
        "plain_jax_calls_per_s": summary(plain_rate),
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--json", default="benchmarks/results/host.json")
    args = ap.parse_args(argv)
    write(run(args.calls, args.pairs), args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())
