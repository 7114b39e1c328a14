"""Helpers shared by the benchmarks: machine facts, statistics, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
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
    }


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def write(result: dict[str, Any], path: str | None) -> None:
    text = json.dumps(result, indent=2, sort_keys=True)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
