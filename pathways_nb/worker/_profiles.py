"""A host's side of ``client.profile``: XLA's own profiler (``jax.profiler``) run in the
host's process while a client asks, its files written on the host's filesystem.

XLA keeps one profiler session per process, so the session is the process's, shared by
the hosts in it (the in-process cluster runs several): the first host a client asks
starts it, into that host's folder, and the last host to stop ends it. One client at a
time profiles a process; another is told who holds it and until when. A session also
ends at its time limit, or when every connection that asked for it has gone, so a
client that died never leaves a host tracing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from pathways_nb._core import PROFILE_MAX_SECONDS, RemoteError
from pathways_nb.worker._answers import ToClient
from pathways_nb.worker._errors import to_remote

# The largest Perfetto trace a host sends its client with the answer to ``stop``; a
# larger one stays in its folder only.
MAX_TRACE_BYTES = 64 << 20
PERFETTO_FILE = "perfetto_trace.json.gz"


@dataclasses.dataclass
class Ended:
    """A finished session: its folder, the files XLA wrote, how it ended."""

    host: str  # the host whose folder it is
    folder: str
    files: list[str]
    started: float
    ended: float
    why: str  # "stopped", "time limit" or "client gone"
    error: str = ""


class ProcessProfiler:
    """The one ``jax.profiler`` session of this process, shared by its hosts.

    ``start`` and ``stop`` block while XLA starts or writes the trace: call them from a
    thread that may wait (a host's pool), never from a host's socket thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenant = 0  # who holds the session (0: nobody)
        self._folder = ""
        self._owner = ""  # the host whose folder the session writes into
        self._started = 0.0
        self._deadline = 0.0
        self._hosts: dict[str, bytes] = {}  # host -> the connection that asked it
        self._run = ""  # the session's own folder, where XLA writes its files
        self._timer: threading.Timer | None = None
        # A session that ended before its client stopped it, kept for that client's
        # stops: the first of its hosts to ask gets it, the others are told it ended.
        self._early: Ended | None = None
        self._early_tenant = 0
        self._early_hosts: set[str] = set()

    def start(
        self, host: str, identity: bytes, tenant: int, folder: str, python: bool, limit: float
    ) -> tuple[str, float]:
        """Start (or join) the session for ``tenant``; return its folder and the time it
        started (seconds since the epoch: the trace's own times count from it)."""
        with self._lock:
            if self._tenant and self._tenant != tenant:
                left = max(0.0, self._deadline - time.time())
                raise _busy(
                    f"host {host}'s process is being profiled for another client (tenant "
                    f"{self._tenant}) for at most {left:.0f} s more; XLA keeps one profiler "
                    "per process. Profile again once it has stopped"
                )
            if self._tenant:
                if host in self._hosts:
                    raise ValueError(
                        f"host {host} is profiling for this client already (since "
                        f"{time.ctime(self._started)}); stop that profile first"
                    )
                self._hosts[host] = identity
                return self._folder, self._started
            os.makedirs(folder, exist_ok=True)
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 1 if python else 0
            # XLA names a session's folder by the second it started; two sessions in one
            # second would share one.
            options.session_id = _run_name(folder)
            self._run = os.path.join(folder, "plugins", "profile", options.session_id)
            try:
                jax.profiler.start_trace(
                    folder, create_perfetto_trace=True, profiler_options=options
                )
            except RuntimeError as exc:
                raise _busy(
                    f"XLA's profiler would not start in host {host}'s process ({exc}); "
                    "was a jax.profiler trace started there by other code? Stop it first"
                ) from None
            self._tenant, self._folder, self._started = tenant, folder, time.time()
            self._owner = host
            self._deadline = self._started + limit
            self._hosts = {host: identity}
            self._early, self._early_tenant, self._early_hosts = None, 0, set()
            self._timer = threading.Timer(limit, self._end_early, ("time limit", self._started))
            self._timer.daemon = True
            self._timer.start()
            return folder, self._started

    def stop(self, host: str, tenant: int) -> Ended | None:
        """Leave the session; the last host to leave ends it and gets what it wrote.
        None while other hosts of the process still take part."""
        with self._lock:
            if self._early_tenant == tenant and host in self._early_hosts:
                self._early_hosts.discard(host)
                ended, self._early = self._early, None
                return ended
            if self._tenant != tenant or host not in self._hosts:
                raise LookupError(
                    f"host {host} is not profiling for this client: start a profile "
                    "before stopping it (client.profile(path).start())"
                )
            del self._hosts[host]
            if self._hosts:
                return None
            return self._end("stopped")

    def departed(self, identity: bytes) -> None:
        """A connection closed: a session nobody who asked for it is left to stop ends."""
        with self._lock:
            gone = [h for h, i in self._hosts.items() if i == identity]
            for h in gone:
                del self._hosts[h]
            if gone and not self._hosts:
                self._end("client gone")  # nobody is left to ask for what it wrote

    def holder(self) -> int:
        """The tenant whose session runs, or 0. Read without the lock, which a stop holds
        while XLA writes the trace: a host's socket thread asks, and must not wait."""
        return self._tenant

    def _end_early(self, why: str, started: float) -> None:
        with self._lock:
            if self._tenant and self._started == started:  # still the session timed
                tenant, hosts = self._tenant, set(self._hosts)
                self._early = self._end(why)
                self._early_tenant, self._early_hosts = tenant, hosts

    def _end(self, why: str) -> Ended:
        """Stop XLA's profiler and list what it wrote; called with the lock held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        error = ""
        try:
            jax.profiler.stop_trace()
        except RuntimeError as exc:  # XLA could not write the trace
            error = str(exc)
        files = []
        with contextlib.suppress(FileNotFoundError):
            files = [os.path.join(self._run, name) for name in sorted(os.listdir(self._run))]
        ended = Ended(self._owner, self._folder, files, self._started, time.time(), why, error)
        self._tenant, self._folder, self._hosts = 0, "", {}
        return ended


PROCESS = ProcessProfiler()


class Profiles:
    """A host's answers to a client's ``profile`` requests (``op``: ``start``/``stop``),
    each done on ``pool``: XLA writes a trace at the stop, which takes a while."""

    def __init__(
        self,
        host: str,
        pool: concurrent.futures.Executor,
        to_client: ToClient,
        confine: Callable[[str], str],
        profiler: ProcessProfiler = PROCESS,
    ) -> None:
        self.host = host
        self._pool = pool
        self._to_client = to_client
        self._confine = confine
        self._profiler = profiler

    def request(self, identity: bytes, tenant: int, h: dict[str, Any]) -> None:
        """Start or stop a profile for the client on ``identity`` (tenant ``tenant``)."""
        rid = h.get("rid")
        try:
            op = h.get("op")
            if op == "start":
                folder, python, limit = _start_fields(h)
                target = os.path.join(self._confine(folder), folder_name(self.host))
                job = self._pool.submit(
                    self._profiler.start, self.host, identity, tenant, target, python, limit
                )
                job.add_done_callback(lambda f: self._started(identity, rid, f))
            elif op == "stop":
                ending = self._pool.submit(self._profiler.stop, self.host, tenant)
                ending.add_done_callback(lambda f: self._stopped(identity, rid, f))
            else:
                raise ValueError(f"a profile request's op is 'start' or 'stop'; got {op!r}")
        except Exception as exc:
            self._fail(identity, rid, exc)

    def departed(self, identity: bytes) -> None:
        """The connection ``identity`` closed (see :meth:`ProcessProfiler.departed`)."""
        if self._profiler.holder():
            self._pool.submit(self._profiler.departed, identity)

    def _started(self, identity: bytes, rid: Any, f: concurrent.futures.Future[Any]) -> None:
        exc = f.exception()
        if exc is not None:
            self._fail(identity, rid, exc)
            return
        folder, started = f.result()
        self._to_client(
            identity, {"t": "reply", "rid": rid, "folder": folder, "started": started}, ()
        )

    def _stopped(self, identity: bytes, rid: Any, f: concurrent.futures.Future[Any]) -> None:
        exc = f.exception()
        if exc is not None:
            self._fail(identity, rid, exc)
            return
        ended: Ended | None = f.result()
        if ended is None:  # another host of this process ends the session
            self._to_client(identity, {"t": "reply", "rid": rid, "shared": True}, ())
            return
        header: dict[str, Any] = {
            "t": "reply",
            "rid": rid,
            "host": ended.host,
            "folder": ended.folder,
            "files": ended.files,
            "started": ended.started,
            "ended": ended.ended,
            "why": ended.why,
            "error": ended.error,
        }
        trace = _perfetto_bytes(ended.files)
        if isinstance(trace, str):
            header["trace_left"] = trace
            trace = None
        self._to_client(identity, header, [trace] if trace is not None else ())

    def _fail(self, identity: bytes, rid: Any, exc: BaseException) -> None:
        # A RemoteError (a busy profiler) passes through, its host filled in.
        err = to_remote(exc, "invalid", program="profile", slice="", host=self.host)
        self._to_client(identity, {"t": "failed", "rid": rid, "error": err.to_dict()}, ())


def folder_name(host: str) -> str:
    """The name of ``host``'s folder: its name with what a file name cannot hold (the
    ``://`` and ``:`` of an address) made ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", host).strip("_") or "host"


def _start_fields(h: dict[str, Any]) -> tuple[str, bool, float]:
    folder, python, limit = h.get("path"), h.get("python", False), h.get("limit")
    if not isinstance(folder, str) or not os.path.isabs(folder):
        raise ValueError(f"a profile's path is an absolute folder; got {folder!r}")
    if type(python) is not bool:
        raise ValueError(f"a profile's python is True or False; got {python!r}")
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0:
        raise ValueError(f"a profile's limit is a number of seconds above 0; got {limit!r}")
    return folder, python, min(float(limit), PROFILE_MAX_SECONDS)


def _run_name(folder: str) -> str:
    """A name for a new session's folder under ``folder``: the time to the microsecond,
    as XLA's own names sort (``2026_12_06_20_41_13_123456``), and unused."""
    now = time.time()
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime(now)) + f"_{int(now % 1 * 1e6):06d}"
    name, n = stamp, 1
    while os.path.exists(os.path.join(folder, "plugins", "profile", name)):
        name, n = f"{stamp}_{n}", n + 1
    return name


def _perfetto_bytes(files: list[str]) -> bytes | str | None:
    """The session's Perfetto trace (gzipped JSON) to send, or why it is not sent."""
    path = next((p for p in files if os.path.basename(p) == PERFETTO_FILE), None)
    if path is None:
        return None
    size = os.path.getsize(path)
    if size > MAX_TRACE_BYTES:
        return f"{path} is {size >> 20} MiB, over the {MAX_TRACE_BYTES >> 20} MiB sent to clients"
    with open(path, "rb") as f:
        return f.read()


def _busy(message: str) -> RemoteError:
    return RemoteError(message, kind="busy", program="profile", slice="")
