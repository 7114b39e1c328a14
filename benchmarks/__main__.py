"""Every benchmark in one command: JSON and a PNG per experiment, and a summary.

    python -m benchmarks [--quick] [--only NAME ...] [--out benchmarks/results]

Each experiment measures pathways_nb and its comparison side by side in one run (these
machines are noisy: compare ratios from one run, not absolute times across runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

# Each experiment runs in a process of its own: they set XLA_FLAGS before importing JAX,
# and one's clusters and threads must not disturb the next.
EXPERIMENTS: dict[str, tuple[list[str], list[str]]] = {
    # name: (arguments for a full run, arguments for --quick)
    "dispatch": ([], ["--quick"]),
    "size": ([], ["--quick"]),
    "training": ([], ["--quick"]),
    "core": ([], ["--repeats", "1", "--calls", "64", "--roundtrips", "8"]),
    "mpmd": ([], ["--quick"]),
    "widgets": ([], ["--steps", "32", "--repeats", "1"]),
    "memory": ([], ["--programs", "2000", "--checkpoint", "500", "--distinct", "40"]),
    "scale": ([], ["--quick"]),
    "fetch": ([], ["--quick"]),
    "data": ([], ["--quick"]),
    "tls": ([], ["--quick"]),
    "profile": ([], ["--quick"]),
    "colocated": ([], ["--quick"]),
    "proxy": ([], ["--quick"]),
}


def run(names: list[str], quick: bool, out: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"quick": quick, "experiments": {}}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in names:
        full, fast = EXPERIMENTS[name]
        path = os.path.join(out, f"{name}.json")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                f"benchmarks.{name}",
                *(fast if quick else full),
                "--json",
                path,
            ],
            cwd=root,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            summary["experiments"][name] = {"error": proc.stderr[-2000:], "seconds": seconds}
            print(f"{name}: FAILED after {seconds:.0f} s\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        with open(path) as f:
            result = json.load(f)
        png = path.replace(".json", ".png")
        _plot(name, result, png)
        summary["experiments"][name] = {
            "json": path,
            "png": png,
            "seconds": round(seconds, 1),
            "targets_met": result.get("targets_met", {}),
        }
        print(f"{name}: {seconds:.0f} s, targets {result.get('targets_met', {})}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    from benchmarks._table import markdown

    table = markdown(out)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    return summary


def _plot(name: str, result: dict[str, Any], png: str) -> None:
    """A bar per ratio the experiment reports, unless it drew its own plot."""
    if os.path.exists(png) and os.path.getmtime(png) >= os.path.getmtime(png[:-4] + ".json"):
        return  # its main() wrote the PNG beside the JSON
    from benchmarks._plot import grouped_bars

    ratios = _ratios(result)
    grouped_bars(
        png,
        title=f"{name}: pathways_nb / baseline",
        groups=list(ratios),
        series={"ratio": list(ratios.values())},
        ylabel="ratio (1 = the baseline)",
    )


def _ratios(result: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in result.items():
        if isinstance(v, dict):
            out |= _ratios(v, f"{prefix}{k}.")
        elif k == "ratio" and isinstance(v, int | float):
            out[prefix.rstrip(".") or "ratio"] = float(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--only", nargs="+", choices=sorted(EXPERIMENTS), help="run just these")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    summary = run(args.only or list(EXPERIMENTS), args.quick, args.out)
    failed = [n for n, e in summary["experiments"].items() if "error" in e]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
