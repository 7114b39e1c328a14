"""Helpers shared by the benchmarks: machine facts, statistics, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any


def machine() -> dict[str, Any]:
    def v(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "missing"

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "versions": {n: v(n) for n in ("pathways_nb", "jax", "jaxlib", "distributed", "pyzmq")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # The allocator's settings, this process's and so the hosts' (with_hosts_allocator).
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def alternating(
    first: Callable[[], Any],
    second: Callable[[], Any],
    repeats: int,
    inner: int = 1,
    after: Callable[[], Any] = lambda: None,
) -> tuple[list[float], list[float], float]:
    """Seconds per call of ``first()`` and ``second()`` in alternating turns of ``inner``
    calls each (after one untimed call of each), and the median of the paired ratios,
    second over first; ``after()``, untimed, follows each turn of ``first``."""
    first()
    after()
    second()
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            first()
        a.append((time.perf_counter() - t0) / inner)
        after()
        t0 = time.perf_counter()
        for _ in range(inner):
            second()
        b.append((time.perf_counter() - t0) / inner)
    return a, b, statistics.median(y / x for x, y in zip(a, b, strict=True))


def big_array(nbytes: int) -> Any:
    """Float32 normal values filling ``nbytes``, 1024 to a row (a multiple of 4 KiB): the
    large array the fetch, TLS and colocated benchmarks move, the same in each."""
    import numpy as np

    rows = nbytes // 4 // 1024
    return np.random.default_rng(0).standard_normal((rows, 1024)).astype(np.float32)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# Chained runs wait on every 16th result, ours and every baseline alike: plain JAX on CPU
# aborts with ~64 or more collective programs queued.
WAIT_EVERY = 16


def chain(f: Callable[[Any], Any], x0: Any, calls: int) -> Any:
    """``calls`` dependent calls ``x = f(x)`` from ``x0``, waiting on every
    ``WAIT_EVERY``-th result and on the last; returns the last. The same code drives a
    ``jax.Array`` and a ``RemoteArray`` (both answer ``block_until_ready``)."""
    x = x0
    for i in range(calls):
        x = f(x)
        if i % WAIT_EVERY == WAIT_EVERY - 1:
            x.block_until_ready()
    x.block_until_ready()
    return x


def host_pids(client: Any) -> dict[str, int]:
    """The process id of each island's host, from ``client.status()`` (its ``process``
    column reads ``HOSTNAME:PID``)."""
    islands = client.status().islands
    return {
        str(island): int(process.rsplit(":", 1)[1])
        for island, process in zip(islands.island, islands.process, strict=True)
    }


def _threads(pid: int) -> Iterator[tuple[str, list[str]]]:
    """Each thread of process ``pid`` still there: its id and the fields of its
    ``/proc/*/task/*/stat`` after the command name (nice value at index 16)."""
    tasks = f"/proc/{pid}/task"
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/stat") as f:
                yield tid, f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU seconds of process ``pid`` so far: (threads at the process's own priority,
    threads at a raised nice value). Hosts on CPU devices raise the nice value of XLA's
    threads (``PATHWAYS_CPU_DEVICE_NICE``), so for them this is (runtime, devices).
    Without Linux's /proc everything counts as the first."""
    if not os.path.isdir(f"/proc/{pid}/task"):
        import psutil

        return sum(psutil.Process(pid).cpu_times()[:2]), 0.0
    tick = os.sysconf("SC_CLK_TCK")
    base = raised = 0
    for _, fields in _threads(pid):
        ticks = int(fields[11]) + int(fields[12])
        if int(fields[16]) > 0:
            raised += ticks
        else:
            base += ticks
    return base / tick, raised / tick


def core_split(pid: int) -> dict[int, tuple[bool, float, float]]:
    """Per thread of process ``pid``: whether it runs at a raised nice value (on hosts,
    XLA's device threads), and its seconds so far on a core and waiting on the run
    queue for one, from Linux's ``/proc/*/task/*/schedstat``; empty where that is not
    there. See :func:`core_time` for the difference of two.

    CPU seconds say what each process costs; the run-queue wait says who waited for a
    core behind whom, which on a machine whose cores are all busy is where time goes.
    """
    out: dict[int, tuple[bool, float, float]] = {}
    if not os.path.isdir(f"/proc/{pid}/task"):
        return out
    for tid, fields in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, wait_ns = (int(v) for v in f.read().split()[:2])
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[16]) > 0, run_ns / 1e9, wait_ns / 1e9)
    return out


def core_time(
    before: dict[int, tuple[bool, float, float]], after: dict[int, tuple[bool, float, float]]
) -> dict[str, float]:
    """Seconds on a core (``run``) and on the run queue (``wait``) between two
    :func:`core_split` readings, for threads at the process's own priority and at a
    raised nice value (``*_niced``). A thread that ended in between is left out."""
    out = {"run": 0.0, "wait": 0.0, "run_niced": 0.0, "wait_niced": 0.0}
    for tid, (niced, run, wait) in after.items():
        _, run0, wait0 = before.get(tid, (niced, 0.0, 0.0))
        suffix = "_niced" if niced else ""
        out["run" + suffix] += run - run0
        out["wait" + suffix] += wait - wait0
    return out


def write(result: dict[str, Any], path: str | None) -> None:
    text = json.dumps(result, indent=2, sort_keys=True)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)


def with_hosts_allocator() -> None:
    """Run this benchmark's process with the C allocator's settings the hosts run with,
    starting it again if it lacks them (glibc reads them only when a process starts).

    The hosts map large buffers with huge pages (``pathways_nb.deploy._malloc``); plain
    JAX in this process would otherwise fault in every 4 KiB page of its large buffers
    at every run, and a ratio would measure the allocator instead of the runtime (the
    transformer training read 1.14x plain JAX that way, 0.98x with both alike)."""
    from pathways_nb.deploy._malloc import with_huge_pages

    current = os.environ.get("GLIBC_TUNABLES")
    wanted = with_huge_pages(current)
    if wanted == current or not getattr(sys, "orig_argv", None):
        return
    os.environ["GLIBC_TUNABLES"] = wanted
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` giving a process ``devices`` simulated CPU devices (set it before
    JAX is imported)."""
    flag = f"--xla_force_host_platform_device_count={devices}"
    return f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def quick_main(
    argv: list[str] | None,
    doc: str | None,
    name: str,
    run: Callable[[bool], dict[str, Any]],
    plot: Callable[[dict[str, Any], str], None] | None = None,
) -> int:
    """The command line of an experiment with a ``--quick`` mode: JSON (and a PNG) out."""
    import argparse

    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--json", default=f"benchmarks/results/{name}.json")
    args = ap.parse_args(argv)
    result = run(args.quick)
    write(result, args.json)
    if plot is not None:
        plot(result, args.json.replace(".json", ".png"))
    return 0
