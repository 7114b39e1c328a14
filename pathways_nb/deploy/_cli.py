"""The ``pathways-nb`` command."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any


def _count(raw: str) -> int:
    """An argparse type: a whole number, 1 or more (islands, devices, steps)."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more; got {raw!r}")
    return value


def _seconds(raw: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0, such as 10; got {raw!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathways-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local cluster and train a small model on a slice")
    demo.add_argument("--islands", type=_count, default=2)
    demo.add_argument("--devices", type=_count, default=4, help="devices per island")
    demo.add_argument("--steps", type=_count, default=20)
    cluster = sub.add_parser(
        "cluster",
        help="run a local cluster in the foreground for notebooks to share (Ctrl-C stops it)",
        description="Start a Dask scheduler hosting the controller and one worker host per "
        "island, print the address that pw.Client takes, and keep them up until SIGINT or "
        "SIGTERM. Several kernels connecting to it are tenants of one cluster.",
    )
    cluster.add_argument("--islands", type=_count, default=2, help="islands, a worker host each")
    cluster.add_argument("--devices", type=_count, default=4, help="devices per island")
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
    status.add_argument("--timeout", type=_seconds, default=10.0, help="seconds to wait for it")
    proxy = sub.add_parser(
        "proxy",
        help="serve plain JAX on a running cluster: an IFRT proxy for JAX_PLATFORMS=proxy",
        description="Start a gRPC server speaking JAX's IFRT proxy protocol in front of a "
        "running cluster, print the environment a JAX process runs on it with, and serve "
        "until SIGINT or SIGTERM. Each JAX process connecting is a tenant of the cluster, "
        "holding one slice per island.",
    )
    proxy.add_argument("address", nargs="?", help="the Dask scheduler address, tcp://host:port")
    proxy.add_argument("--scheduler-file", help="read the address from this file instead")
    proxy.add_argument(
        "--port", type=int, default=29000, help="the port to listen on (default 29000; 0: any)"
    )
    proxy.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: JAX's client speaks gRPC without "
        "TLS, so the proxy serves this machine only unless told otherwise)",
    )
    proxy.add_argument("--name", default="", help="the tenant name of its sessions")
    proxy.add_argument("--weight", type=_weight, default=1.0, help="their share weight")
    proxy.add_argument(
        "--islands", type=_count, default=None, help="slices on the first N islands only"
    )
    for command in (demo, cluster, status, proxy):
        # A usage error names the subcommand's own usage, not the top-level one.
        command.set_defaults(usage=command)
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
    parser = args.usage
    if args.command == "demo":
        from pathways_nb.deploy._demo import run_demo
        from pathways_nb.deploy._local import check_size

        try:
            check_size(args.islands, args.devices, "cpu")
        except ValueError as exc:
            parser.error(str(exc))
        result = run_demo(args.islands, args.devices, args.steps)
        ok = result["max_diff"] < 1e-4
        if not ok:
            print("losses differ from plain JAX", file=sys.stderr)
        return 0 if ok else 1
    if args.command == "cluster":
        return _cluster(parser, args)
    if args.command == "proxy":
        return _proxy(parser, args)
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


def _cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``pathways-nb cluster``: every setting checked (a usage error), then served."""
    from pathways_nb._core import BrokenError
    from pathways_nb.deploy._serve import serve

    platform = None if args.platform == "auto" else args.platform
    if args.host in ("", "0.0.0.0", "::"):
        parser.error(
            f"--host is an address the cluster's processes are reached at, such as this "
            f"machine's IP; got {args.host!r}"
        )
    if args.scheduler_file:
        _check_writable(parser, args.scheduler_file)
    security = _security(parser, args)
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


def _proxy(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``pathways-nb proxy``: the cluster checked reachable, then served until a signal."""
    import signal
    import threading

    from pathways_nb._core import PathwaysError
    from pathways_nb.deploy._serve import read_address
    from pathways_nb.deploy._watch import watch_parent

    if not 0 <= args.port < 65536:
        parser.error(f"--port is 0 (any free port) or a port number below 65536; got {args.port}")
    try:
        address = read_address(args.address, args.scheduler_file)
    except ValueError as exc:
        parser.error(str(exc))
    from pathways_nb.proxy import check_cluster, serve

    try:
        islands = check_cluster(address, args.scheduler_file)
        server = serve(
            None if args.scheduler_file else address,
            scheduler_file=args.scheduler_file,
            host=args.host,
            port=args.port,
            name=args.name,
            weight=args.weight,
            islands=args.islands,
        )
    except (PathwaysError, OSError) as exc:
        print(f"pathways-nb proxy: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Started by pw.use_jax (or beside a cluster that is): it ends with its parent.
    watch_parent(stop.set)
    print(
        f"pathways-nb proxy: serving {islands} island(s) of {address} on "
        f"{args.host}:{server.port}; run JAX on it with\n"
        f"JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=grpc://{args.host}:{server.port} "
        "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true",
        flush=True,
    )
    stop.wait()
    server.stop()
    return 0


def _weight(raw: str) -> float:
    """An argparse type: a tenant's share weight, as ``pw.Client`` checks it."""
    from pathways_nb._core import validate_weight

    try:
        return validate_weight(float(raw))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_writable(parser: argparse.ArgumentParser, path: str) -> None:
    """Refuse a ``--scheduler-file`` that cannot be written, before the cluster starts
    (it is written only once every host is up)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"--scheduler-file {path!r} is a folder: name a file in it, such as x.json")
    if not os.path.isdir(folder):
        parser.error(
            f"--scheduler-file {path!r}: its folder {folder!r} does not exist; create it or "
            "name a file in a folder that does"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        parser.error(
            f"--scheduler-file {path!r}: its folder {folder!r} is not writable by this user; "
            "name a file in a folder that is"
        )


def _security(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The cluster's TLS from ``--tls`` or the ``--tls-*`` files (each checked readable
    here), or None for none."""
    tls_files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if args.tls and any(tls_files):
        parser.error("--tls makes the cluster's certificates: give it or the --tls-* files")
    if args.tls:
        return True
    if not any(tls_files):
        return None
    if not all(tls_files):
        parser.error("TLS takes all of --tls-ca-file, --tls-cert and --tls-key")
    for flag, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), tls_files, strict=True):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            parser.error(
                f"{flag} {path!r} cannot be read ({exc.strerror or exc}): give the path of a "
                "PEM file this user may read"
            )
    from distributed.security import Security

    ca, cert, key = tls_files
    return Security(
        tls_ca_file=ca,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_client_cert=cert,
        tls_client_key=key,
        require_encryption=True,
    )


if __name__ == "__main__":
    sys.exit(main())
