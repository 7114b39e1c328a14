"""The ``pathways-nb`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pathways-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local cluster and train a small model on a slice")
    demo.add_argument("--islands", type=int, default=2)
    demo.add_argument("--devices", type=int, default=4, help="devices per island")
    demo.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from pathways_nb.deploy._demo import run_demo

        result = run_demo(args.islands, args.devices, args.steps)
        ok = result["max_diff"] < 1e-4
        if not ok:
            print("losses differ from plain JAX", file=sys.stderr)
        return 0 if ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
