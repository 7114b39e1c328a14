"""What JupyterLab's Pathways panel shows, one board per cluster.

A board holds a client of its cluster (connected on first use, named ``JupyterLab``)
and what the notebook's live widgets keep between refreshes: the placement map's last
programs and the timeline's rows. :meth:`Board.snapshot` returns everything the panel
draws in one JSON-ready dict. Boards run in the Jupyter server's process, each on a
thread of its own (:meth:`Board.submit`), so a cluster that is slow to answer holds up
only its own board; two browser tabs polling the same cluster take turns on its client.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pathways_nb.client import Client, EventRows
from pathways_nb.viz import PlacementRows, TimelineRows, status_html

# pw.LocalCluster keeps its scheduler file here while it runs (see deploy/_local.py).
LOCAL_PATTERN = "pathways-cluster-*/scheduler.json"
# ...and, when it runs with TLS, a client's CA, certificate and key (deploy/_security.py).
LOCAL_TLS_FILES = ("ca.pem", "client.pem", "client-key.pem")
# How much of the event log the panel's timeline draws.
TIMELINE_SECONDS = 10.0
TIMELINE_ROWS = 1000


@dataclass(frozen=True)
class Found:
    """A cluster the panel can show: its Dask scheduler address and where it was found
    (``"local"``: a ``pw.LocalCluster`` on this machine, ``"configured"``: the server's
    configuration or ``PATHWAYS_ADDRESS``)."""

    address: str
    source: str
    # A local cluster's folder, where a cluster started with TLS keeps a client's files.
    folder: str = field(default="", compare=False)

    def tls_files(self) -> dict[str, str] | None:
        """A local TLS cluster's client files, by the names ``distributed.Security``
        takes them; None for another cluster."""
        paths = [os.path.join(self.folder, name) for name in LOCAL_TLS_FILES]
        if not self.folder or not all(os.path.exists(p) for p in paths):
            return None
        return dict(zip(("tls_ca_file", "tls_client_cert", "tls_client_key"), paths, strict=True))

    def security(self) -> Any:
        """The ``distributed.Security`` to connect with: a local TLS cluster's client
        files, else None (a configured address uses Dask's configuration)."""
        files = self.tls_files()
        if files is None:
            return None
        from distributed.security import Security

        return Security(**files)

    def connect_code(self) -> str:
        """The cell that connects a notebook to this cluster ("Insert pw.Client")."""
        files = self.tls_files()
        if files is None:
            return f"import pathways_nb as pw\n\nclient = pw.Client({json.dumps(self.address)})"
        given = "".join(f"    {k}={json.dumps(v)},\n" for k, v in files.items())
        return (
            "import pathways_nb as pw\nfrom distributed.security import Security\n\n"
            "# This cluster runs with TLS: a client certificate it made for this user.\n"
            f"security = Security(\n{given})\n"
            f"client = pw.Client({json.dumps(self.address)}, security=security)"
        )

    def to_dict(self) -> dict[str, str]:
        return {"address": self.address, "source": self.source}


def local_clusters(tmp: str | None = None) -> list[Found]:
    """The ``pw.LocalCluster`` s of this user running on this machine, newest first."""
    found = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path in glob.glob(os.path.join(tmp or tempfile.gettempdir(), LOCAL_PATTERN)):
        try:
            st = os.stat(path)
            if uid is not None and st.st_uid != uid:
                continue  # another user's cluster: not ours to show
            with open(path) as f:
                address = json.load(f)["address"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a cluster starting or closing: its file is half written or gone
        if isinstance(address, str) and address:
            found.append((st.st_mtime, Found(address, "local", os.path.dirname(path))))
    return [f for _, f in sorted(found, key=lambda x: -x[0])]


def check_address(address: object) -> str:
    """A Dask scheduler address as the panel accepts it; ValueError otherwise."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(
            "address names a cluster's Dask scheduler, such as 'tcp://127.0.0.1:8786'; "
            f"got {address!r}"
        )
    given = address.strip()
    address = given if "://" in given else "tcp://" + given
    proto, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if proto not in ("tcp", "tls") or not host or not port:
        raise ValueError(
            "address names a cluster's Dask scheduler as tcp://HOST:PORT (tls:// too); "
            f"got {given!r}"
        )
    # str.isdigit() takes "²" and "١٢٣"; the sockets below take only ASCII digits.
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(
            f"the port of a scheduler address is a number from 1 to 65535 in ASCII digits, "
            f"as in tcp://127.0.0.1:8786; got port {port!r} in {given!r}"
        )
    return address


class Board:
    """One cluster's panel contents, refreshed on demand from a client of its own.

    :meth:`submit` refreshes it on the board's own thread: an address that accepts
    connections and never answers holds that thread for the client's timeout, and no
    other board's.
    """

    def __init__(self, found: Found, connect: Callable[[Found], Client]) -> None:
        self.found = found
        self._connect = connect
        self._lock = threading.Lock()  # held while the client is used
        self._client: Client | None = None
        self._placement = PlacementRows()
        self._cursor = 0  # the placement map's place in the event log
        self._timeline = TimelineRows(TIMELINE_SECONDS, TIMELINE_ROWS)
        # The thread starts with the first submit; close() stops it after its last task.
        self._state = threading.Lock()  # guards _closed and submissions to _thread
        self._closed = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pathways-board")

    @property
    def connected(self) -> bool:
        """Whether it holds a client (one that connected and has not failed since)."""
        return self._client is not None

    def submit(self) -> Future[dict[str, Any]]:
        """:meth:`snapshot`, on the board's own thread."""
        with self._state:
            if not self._closed:
                return self._thread.submit(self.snapshot)
        done: Future[dict[str, Any]] = Future()
        done.set_result(self._closed_reply())
        return done

    def snapshot(self) -> dict[str, Any]:
        """The panel's contents now: ``summary`` and ``html`` (the status tables),
        ``devices`` (the placement map), ``rows`` and ``lanes`` (the timeline),
        ``tenants`` (their names by id, for the timeline's legend), or ``error`` saying
        why the cluster cannot be shown."""
        with self._lock:
            if self._closed:
                return self._closed_reply()
            try:
                if self._client is None:
                    self._client = self._connect(self.found)
                    self._placement, self._cursor = PlacementRows(), 0
                    self._timeline = TimelineRows(TIMELINE_SECONDS, TIMELINE_ROWS)
                client = self._client
                s = client.status()
                # A view of the whole cluster: every tenant's programs.
                before = self._cursor
                events, self._cursor = client.event_rows(before, all_tenants=True)
                devices = self._placement.rows(s, events)

                def event_rows(after: int, since: float = 0.0) -> EventRows:
                    # Past the first poll the timeline reads from where the placement
                    # map just did: the same rows, not asked of the controller twice.
                    if before and after == before:
                        return EventRows(events, self._cursor)
                    return client.event_rows(after, since, all_tenants=True)

                slice_names = {str(r[0]): str(r[1]) for r in s.rows["slices"]}
                self._timeline.update(event_rows, slice_names)
            except Exception as exc:  # shown in the panel; the next poll connects again
                self._drop_client()
                return {"address": self.found.address, "error": _reason(self.found, exc)}
            return {
                "address": self.found.address,
                "summary": s.summary,
                "html": status_html(s),
                "devices": devices,
                "rows": self._timeline.rows,
                "lanes": self._timeline.lanes,
                "span_ms": self._timeline.span_ms,
                # The timeline colours programs by tenant: the legend names them.
                "tenants": {str(r[0]): str(r[1]) for r in s.rows["tenants"]},
                "connect": self.found.connect_code(),
                "updated": time.time(),
            }

    def close(self, wait: bool = False) -> None:
        """Close its client once the refresh in progress, if any, has finished, on the
        board's thread. Without ``wait`` this returns at once, even while that refresh
        waits on an address that never answers; with it, once the thread has stopped.
        Safe to call twice."""
        with self._state:
            if not self._closed:
                self._closed = True
                self._thread.submit(self._close_client)
        self._thread.shutdown(wait=wait)

    def _close_client(self) -> None:
        with self._lock:
            self._drop_client()

    def _closed_reply(self) -> dict[str, Any]:
        return {
            "address": self.found.address,
            "error": f"the panel closed its board of {self.found.address} to show other "
            "clusters; refresh to show it again",
        }

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # A client of a cluster that is gone closes what it can; nothing to report.
            with contextlib.suppress(Exception):
                client.close()


def _reason(found: Found, exc: BaseException) -> str:
    return f"cannot show the cluster at {found.address}: {type(exc).__name__}: {exc}"


def _connect(found: Found) -> Client:
    return Client(
        found.address,
        name="JupyterLab",
        timeout=10.0,
        observer=True,
        security=found.security(),
    )


class Boards:
    """The boards of the clusters the panel has shown, by address, and the clusters it
    can offer: ``configured`` addresses (and ``$PATHWAYS_ADDRESS``) and this user's
    ``pw.LocalCluster`` s. At most ``max_boards`` are kept: past that, boards holding no
    client (addresses that never connected) are dropped first, then the connected board
    unused longest is closed."""

    def __init__(
        self,
        configured: list[str] | tuple[str, ...] = (),
        connect: Callable[[Found], Client] = _connect,
        tmp: str | None = None,
        max_boards: int = 8,
    ) -> None:
        env = os.environ.get("PATHWAYS_ADDRESS", "")
        # Addresses that are not one are skipped, and said (the panel shows them).
        self.problems: list[str] = []
        self._configured = []
        for given, where in [*((a, "configured") for a in configured), (env, "PATHWAYS_ADDRESS")]:
            if where == "PATHWAYS_ADDRESS" and not env:
                continue
            try:
                self._configured.append(check_address(given))
            except ValueError as exc:
                self.problems.append(f"{where}: {exc}")
        self._connect = connect
        self._tmp = tmp
        self._max = max_boards
        self._lock = threading.Lock()
        self._boards: dict[str, Board] = {}

    def found(self) -> list[Found]:
        """The clusters to offer, configured ones first, each address once."""
        out: dict[str, Found] = {}
        for a in self._configured:
            out.setdefault(a, Found(a, "configured"))
        for f in local_clusters(self._tmp):
            out.setdefault(f.address, f)
        return list(out.values())

    def board(self, address: object) -> Board:
        """The board of the cluster at ``address`` (one the panel offers, or any other
        Dask scheduler address); ValueError for an address that is not one."""
        address = check_address(address)
        with self._lock:
            b = self._boards.pop(address, None)
            if b is None:
                known = {f.address: f for f in self.found()}
                b = Board(known.get(address, Found(address, "given")), self._connect)
            self._boards[address] = b  # newest last
            stale = []
            while self._max > 0 and len(self._boards) > self._max:
                # Looking up addresses that lead nowhere must not close a connected
                # board's client (and lose its timeline).
                idle = [x for x in self._boards.values() if x is not b and not x.connected]
                old = idle[0] if idle else next(iter(self._boards.values()))
                del self._boards[old.found.address]
                stale.append(old)
        for old in stale:
            old.close()
        return b

    def close(self) -> None:
        with self._lock:
            boards, self._boards = list(self._boards.values()), {}
        for b in boards:
            b.close()
