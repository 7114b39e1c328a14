"""The ``pathways-nb`` command."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathways-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local cluster and train a small model on a slice")
    demo.add_argument("--islands", type=int, default=2)
    demo.add_argument("--devices", type=int, default=4, help="devices per island")
    demo.add_argument("--steps", type=int, default=20)
    cluster = sub.add_parser(
        "cluster",
        help="run a local cluster in the foreground for notebooks to share (Ctrl-C stops it)",
        description="Start a Dask scheduler hosting the controller and one worker host per "
        "island, print the address that pw.Client takes, and keep them up until SIGINT or "
        "SIGTERM. Several kernels connecting to it are tenants of one cluster.",
    )
    cluster.add_argument("--islands", type=int, default=2, help="islands, a worker host each")
    cluster.add_argument("--devices", type=int, default=4, help="devices per island")
    cluster.add_argument(
        "--platform",
        default="cpu",
        choices=("cpu", "auto"),
        help="'cpu' simulates the devices (default); 'auto' lets each host use the "
        "accelerators it finds",
    )
    cluster.add_argument(
        "--scheduler-file",
        help="write the addresses here as JSON once every host is up (removed on exit)",
    )
    cluster.add_argument("--no-dashboard", action="store_true", help="no Dask dashboard")
    cluster.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on: 127.0.0.1 (default) serves this machine only; this "
        "machine's IP serves clients on other machines too",
    )
    cluster.add_argument(
        "--port",
        type=int,
        default=0,
        help="the Dask scheduler's port, as in `dask scheduler --port 8786`: notebooks then "
        "connect with pw.Client('tcp://HOST:PORT'); 0 (default) takes any free one",
    )
    cluster.add_argument(
        "--tls",
        action="store_true",
        help="run with TLS on certificates made for this cluster (needs `cryptography`); "
        "notebooks of this user on this machine connect with "
        "pw.Client(scheduler_file=...), which finds the client's certificate",
    )
    for flag, what in (
        ("--tls-ca-file", "the CA certificate(s) every process checks its peers' against"),
        ("--tls-cert", "the certificate the scheduler, workers and local clients show"),
        ("--tls-key", "that certificate's private key"),
    ):
        cluster.add_argument(
            flag,
            help=f"TLS, as `dask scheduler {flag}`: {what} (PEM). With all three the "
            "cluster runs with TLS (tls:// addresses), its pathways links too",
        )
    status = sub.add_parser("status", help="print a running cluster's islands, slices and tenants")
    status.add_argument("address", nargs="?", help="the Dask scheduler address, tcp://host:port")
    status.add_argument("--scheduler-file", help="read the address from this file instead")
    status.add_argument("--json", action="store_true", help="the tables as JSON")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for it")
    sub.add_parser(
        "lab",
        help="start JupyterLab with the Pathways panel (other arguments go to `jupyter lab`)",
        description="Run `jupyter lab` with the Pathways side panel loaded from this install: "
        "the panel shows your pw.LocalClusters, $PATHWAYS_ADDRESS, or any scheduler address "
        "you type into it.",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "lab":
        import importlib.util
        import os

        from pathways_nb.lab import lab_arguments

        if importlib.util.find_spec("jupyterlab") is None:
            print(
                "pathways-nb lab: JupyterLab is not installed in this environment "
                f"({sys.executable}); install it with `pip install 'pathways_nb[lab]'` "
                "(or `pip install jupyterlab`)",
                file=sys.stderr,
            )
            return 1
        command = [sys.executable, "-m", "jupyter", "lab", *lab_arguments(), *rest]
        os.execv(sys.executable, command)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "demo":
        from pathways_nb.deploy._demo import run_demo

        result = run_demo(args.islands, args.devices, args.steps)
        ok = result["max_diff"] < 1e-4
        if not ok:
            print("losses differ from plain JAX", file=sys.stderr)
        return 0 if ok else 1
    if args.command == "cluster":
        from pathways_nb.deploy._serve import serve

        for label in ("islands", "devices"):
            if getattr(args, label) < 1:
                parser.error(f"--{label} must be a positive integer; got {getattr(args, label)}")
        platform = None if args.platform == "auto" else args.platform
        if args.host in ("", "0.0.0.0", "::"):
            parser.error(
                f"--host is an address the cluster's processes are reached at, such as this "
                f"machine's IP; got {args.host!r}"
            )
        from pathways_nb._core import BrokenError

        tls_files = (args.tls_ca_file, args.tls_cert, args.tls_key)
        security: Any = None
        if args.tls and any(tls_files):
            parser.error("--tls makes the cluster's certificates: give it or the --tls-* files")
        if args.tls:
            security = True
        elif any(tls_files):
            if not all(tls_files):
                parser.error("TLS takes all of --tls-ca-file, --tls-cert and --tls-key")
            from distributed.security import Security

            ca, cert, key = tls_files
            security = Security(
                tls_ca_file=ca,
                tls_scheduler_cert=cert,
                tls_scheduler_key=key,
                tls_worker_cert=cert,
                tls_worker_key=key,
                tls_client_cert=cert,
                tls_client_key=key,
                require_encryption=True,
            )
        try:
            return serve(
                args.islands,
                args.devices,
                platform=platform,
                scheduler_file=args.scheduler_file,
                dashboard=not args.no_dashboard,
                host=args.host,
                port=args.port,
                security=security,
            )
        except (ValueError, ImportError) as exc:  # a setting no cluster can start with
            parser.error(str(exc))
        except BrokenError as exc:  # a process of the cluster failed to start
            print(f"pathways-nb cluster: {exc}", file=sys.stderr)
            return 1
    if args.command == "status":
        from pathways_nb._core import PathwaysError
        from pathways_nb.deploy._serve import read_address, status_report

        try:
            address = read_address(args.address, args.scheduler_file)
        except ValueError as exc:
            parser.error(str(exc))
        try:
            print(status_report(address, as_json=args.json, timeout=args.timeout))
        except (PathwaysError, OSError) as exc:
            print(f"pathways-nb status: {exc}", file=sys.stderr)
            return 1
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
