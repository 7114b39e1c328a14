"""``pathways-nb cluster`` and ``pathways-nb status``: a cluster that outlives any one
kernel, so several notebooks (tenants) share it, and a look at one from a shell.

``serve`` keeps a :class:`~pathways_nb.deploy.LocalCluster` up in the foreground until
SIGINT or SIGTERM, or until its scheduler (the controller's process) exits, or until the
process named in ``$PATHWAYS_PARENT_PID`` (if set) exits; the cluster's processes watch
this one, so even a SIGKILL of it leaves no orphans.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

from pathways_nb._core import BrokenError
from pathways_nb.deploy._local import LocalCluster, counted
from pathways_nb.deploy._security import client_files
from pathways_nb.deploy._watch import remove_cluster_dir, watch_parent


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of raising wherever the main thread is."""
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_info(path: str, info: dict[str, Any]) -> None:
    """Write the cluster's addresses atomically: a reader never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, path)


def serve(
    islands: int,
    devices: int,
    *,
    platform: str | None = "cpu",
    scheduler_file: str | None = None,
    dashboard: bool = True,
    host: str = "127.0.0.1",
    port: int = 0,
    security: Any = None,
    out: IO[str] = sys.stdout,
    poll: float = 0.5,
) -> int:
    """Run a local cluster until told to stop; returns the command's exit status.

    ``scheduler_file``, when given, receives the addresses as JSON once every host is
    up (``address``, ``controller``, ``dashboard``, ``pid``, ``islands``,
    ``devices_per_island``; with TLS, ``tls``: the files of a client certificate) and is
    removed on exit: scripts wait for it, then connect
    with ``pw.Client(scheduler_file=path)``. ``security`` (a ``distributed.Security``)
    runs the cluster with TLS, as ``LocalCluster(security=...)`` does.
    """
    stop = threading.Event()
    orphaned = threading.Event()

    def parent_gone() -> None:
        orphaned.set()
        stop.set()

    # Started on behalf of another process (JupyterLab's panel names its server in
    # $PATHWAYS_PARENT_PID): the cluster ends when that process does.
    watch_parent(parent_gone)
    with _stop_on_signals(stop):
        cluster = LocalCluster(
            islands,
            devices,
            platform=platform,
            dashboard=dashboard,
            host=host,
            port=port,
            security=security,
        )
        try:
            info = {
                "address": cluster.scheduler_address,
                "controller": cluster.controller_address,
                "dashboard": cluster.dashboard_link,
                "pid": os.getpid(),
                "islands": islands,
                "devices_per_island": devices,
            }
            if cluster.security is not None:
                # A client's certificate, in the cluster's folder only this user reads:
                # pw.Client(scheduler_file=...) connects with it.
                info["tls"] = client_files(cluster.logs_dir)
            if scheduler_file:
                _write_info(scheduler_file, info)
            kind = platform or "auto"
            print(
                f"pathways_nb cluster: {counted(islands, 'island')} x "
                f"{counted(devices, kind + ' device')}\n"
                f"  scheduler  {cluster.scheduler_address}\n"
                f"  connect    pw.Client({cluster.scheduler_address!r}"
                f"{_security_hint(info.get('tls'))})\n"
                + (f"  dashboard  {cluster.dashboard_link}\n" if cluster.dashboard_link else "")
                + "Ctrl-C or SIGTERM stops it.",
                file=out,
                flush=True,
            )
            while not stop.wait(poll):
                try:
                    cluster.check_alive()
                except BrokenError as exc:
                    print(f"{exc}\nstopping the cluster", file=sys.stderr, flush=True)
                    return 1
            print("stopping the cluster", file=out, flush=True)
            return 0
        finally:
            cluster.close()
            if scheduler_file:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(scheduler_file)
            if orphaned.is_set():
                # The folder its starter keeps its log in ($PATHWAYS_CLUSTER_DIR), which
                # the starter, gone, will not remove.
                remove_cluster_dir()


def _security_hint(files: Any) -> str:
    """What a client adds to reach a cluster started with TLS (``files``: its client
    files, see ``_security.client_files``)."""
    if not files:
        return ""
    given = ", ".join(f"{k}={v!r}" for k, v in files.items())
    return f", security=Security({given})"


def read_address(address: str | None, scheduler_file: str | None) -> str:
    """The scheduler address given on the command line, or the one in a scheduler file."""
    from pathways_nb.client._discovery import address_from_file

    if address and scheduler_file:
        raise ValueError("give a scheduler address or --scheduler-file, not both")
    if scheduler_file:
        return address_from_file(scheduler_file)
    if not address:
        raise ValueError(
            "give the cluster's Dask scheduler address (tcp://host:8786) or --scheduler-file"
        )
    return address


def status_report(address: str, as_json: bool = False, timeout: float = 10.0) -> str:
    """The cluster's islands, slices and tenants, as text or JSON (the snapshot's rows).

    It looks as an observer: no tenant joins, and the event log does not see it come.
    """
    from pathways_nb.client import Client

    with Client(address, name="pathways-nb status", timeout=timeout, observer=True) as client:
        s = client.status()
    rows = s.rows
    if as_json:
        tables = {
            name: [dict(zip(s.COLUMNS[name], r, strict=True)) for r in table]
            for name, table in rows.items()
            if name != "events"
        }
        report = {"address": address, "quotas": s.quotas, **tables}
        return json.dumps(report, default=str, indent=2)
    return "\n".join(
        [
            f"cluster at {address}",
            repr(s),
            "",
            "tenants:",
            s.tenants.to_string(index=False) if len(s.tenants) else "  (none)",
        ]
    )
