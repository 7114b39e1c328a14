"""``pw.LocalCluster``: a real Dask cluster on this machine with pathways preloaded.

The scheduler (and so the controller) runs in a process of its own, never in the
notebook kernel; each island is one Dask worker process (under a nanny, started with
spawn) owning ``devices_per_island`` devices. Every process watches the one that
started it, so a killed kernel leaves no orphans.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import psutil

from pathways_nb._core import BrokenError, ClosedError, Config, ResourceExhaustedError
from pathways_nb.deploy._accelerators import island_envs, spare_the_hosts_gpus
from pathways_nb.deploy._security import cluster_security, command_options, write_client_files
from pathways_nb.deploy._watch import CLUSTER_DIR_ENV, PARENT_ENV
from pathways_nb.deploy.worker import HOST_FAILED

# Dask housekeeping retuned for processes that share their cores with accelerator hosts:
# (setting, Dask's default, ours). The event-loop health check every 20 ms and the
# worker's statistical profiler every 10 ms each cost about 3% of a core in every process,
# idle or not; the system monitor (psutil's CPU, memory, network and disk counters) every
# 500 ms and the memory monitor every 100 ms cost an idle host and its nanny another
# ~8 ms of CPU per second between them. At the values here an idle host takes ~5 ms per
# second, its nanny ~2.5: the health check still warns about a blocked loop (its limit is
# seconds), the dashboard's profiles and system plots still fill, and a runaway worker is
# still caught within half a second. A value set in Dask's configuration (file or
# ``DASK_*`` variable) is kept.
_DASK_TUNING = (
    ("distributed.admin.tick.interval", "20ms", "500ms"),
    ("distributed.worker.profile.interval", "10ms", "500ms"),
    ("distributed.worker.profile.cycle", "1000ms", "5s"),
    ("distributed.admin.system-monitor.interval", "500ms", "2s"),
    ("distributed.worker.memory.monitor-interval", "100ms", "500ms"),
)


def _dask_tuning(env: dict[str, str]) -> dict[str, str]:
    """``DASK_*`` variables for the settings of ``_DASK_TUNING`` still at Dask's default."""
    import dask.config
    from dask.utils import parse_timedelta

    out = {}
    for key, stock, ours in _DASK_TUNING:
        name = "DASK_" + key.upper().replace(".", "__").replace("-", "_")
        if name in env:
            continue
        current = dask.config.get(key, None)
        if current is None or parse_timedelta(current) == parse_timedelta(stock):
            out[name] = ours
    return out


# A LocalCluster starts one host process (and its nanny) per island on this machine.
MAX_ISLANDS = 64
MAX_SIMULATED_DEVICES = 1024
# What a host and its nanny hold once JAX is loaded and a program has run (measured:
# ~250 MiB and ~60 MiB), before any arrays.
_HOST_BYTES = 320 << 20


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 island", "2 islands"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_size(islands: int, devices: int, platform: str | None) -> None:
    """Refuse a cluster this machine cannot start, before any process starts."""
    for label, value in (("islands", islands), ("devices_per_island", devices)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be a positive integer; got {value!r}")
    elsewhere = (
        "for more, run hosts on other machines (dask worker --preload "
        "pathways_nb.deploy.worker; see the README)"
    )
    if islands > MAX_ISLANDS:
        raise ValueError(
            f"a LocalCluster starts one host process per island on this machine, up to "
            f"{MAX_ISLANDS}; got islands={islands}: {elsewhere}"
        )
    if platform == "cpu" and devices > MAX_SIMULATED_DEVICES:
        raise ValueError(
            f"devices_per_island is at most {MAX_SIMULATED_DEVICES} simulated CPU devices "
            f"per host; got {devices}"
        )
    available = psutil.virtual_memory().available
    if islands * _HOST_BYTES > available:
        raise ResourceExhaustedError(
            f"islands={islands} starts {islands} host processes of about "
            f"{_HOST_BYTES / 2**30:.2f} GiB each ({islands * _HOST_BYTES / 2**30:.1f} GiB) "
            f"before any array, and this machine has {available / 2**30:.1f} GiB available: "
            f"ask for fewer islands, or {elsewhere}"
        )


def _check_listenable(host: str, port: int) -> None:
    """Refuse a ``host`` no process here can listen on (not one of this machine's
    addresses, or a name that does not resolve) or a ``port`` in use there, before any
    process starts: the Dask scheduler would exit with the cause deep in its traceback."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # As the scheduler's own listener does: a port left in TIME_WAIT is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {port} on {host} is in use (by another Dask scheduler or pathways "
                "cluster?): choose another, or 0 for any free one"
            ) from None
        raise ValueError(
            f"host={host!r} cannot be listened on here ({exc.strerror or exc}): it must be "
            "127.0.0.1 (the default), this machine's name, or one of its own IP addresses"
        ) from None


def _host_failure(log_text: str) -> str:
    """The exception that kept a worker's host from starting, as its log's traceback
    ends (``RuntimeError: Unable to initialize backend ...``); "" if none is there."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if HOST_FAILED in line]
    if not starts:
        return ""
    cause = ""
    for line in lines[starts[-1] + 1 :]:
        if _LOG_LINE.match(line):
            break  # the traceback ended: the worker's next log record
        if _EXCEPTION_LINE.match(line):
            cause = line.strip()
    return cause


# A log record of the worker (``2026-12-06 08:05:06,706 - distributed...``) and the last
# line of a traceback (``RuntimeError: ...``).
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def _read_scheduler_file(path: str) -> dict[str, Any] | None:
    """The scheduler file's contents, or None while there is none whole to read.

    Dask writes the file in place, so it may be read half written. A scheduler that fails
    at start (a preload raising) removes it as it exits, perhaps just after it was seen:
    the caller then goes on to find the process's exit, and reports it with the log.
    """
    try:
        with open(path) as f:
            info = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) else None


class LocalCluster:
    """An embedded cluster: ``islands`` hosts of ``devices_per_island`` devices each.

    >>> with pw.LocalCluster(islands=2, devices_per_island=4) as cluster:
    ...     client = pw.Client(cluster)

    ``platform="cpu"`` (the default) simulates devices with XLA's host platform;
    ``platform=None`` lets each worker use the accelerators JAX finds (the CPU, with
    ``devices_per_island`` devices, where it finds none), and a JAX platform name
    (``"cuda"``, ``"rocm"``, ``"tpu"``) asks for that one. Where the islands use NVIDIA
    or AMD GPUs, island ``i`` owns the ``i``-th run of ``devices_per_island`` of the
    machine's GPUs (those ``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` or
    ``ROCR_VISIBLE_DEVICES`` shows, if set), so no two hosts drive one GPU; on a TPU VM,
    a block of ``devices_per_island`` chips (``TPU_VISIBLE_CHIPS``). ``host`` is the
    address every process listens on: 127.0.0.1 (the default) serves this machine only;
    this machine's IP lets clients on other machines connect. ``port`` is the Dask
    scheduler's, the one in the address ``pw.Client`` takes (``8786`` gives
    ``tcp://HOST:8786``, as ``dask scheduler`` does); 0, the default, takes any free one.

    ``security=True`` runs the cluster with TLS, on certificates made for it alone (as
    Dask's ``LocalCluster(security=True)``; needs the ``cryptography`` package), or on
    those of a ``distributed.Security`` given: Dask's links and every pathways link
    (client to controller, client to host, host to host) are then encrypted and
    mutually authenticated, and the address is ``tls://HOST:PORT``. ``pw.Client(cluster)``
    uses :attr:`security`; a client elsewhere needs the CA and a client certificate.
    """

    def __init__(
        self,
        islands: int = 2,
        devices_per_island: int = 4,
        *,
        platform: str | None = "cpu",
        dashboard: bool = True,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
        host: str = "127.0.0.1",
        port: int = 0,
        security: Any = None,
    ) -> None:
        check_size(islands, devices_per_island, platform)
        if not isinstance(host, str) or not host or host in ("0.0.0.0", "::"):
            raise ValueError(
                "host is the address this machine's processes listen on and others reach "
                f"them at, such as 127.0.0.1 (the default) or this machine's IP; got {host!r}"
            )
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(
                f"port is the Dask scheduler's TCP port, 0 (the default) for any free one or "
                f"a number up to 65535 such as 8786; got {port!r}"
            )
        _check_listenable(host, port)
        self.host = host
        self.port = port
        self.islands = islands
        self.devices_per_island = devices_per_island
        if platform is not None and (not isinstance(platform, str) or not platform):
            raise ValueError(
                "platform is 'cpu' (simulated devices), None (the accelerators JAX finds) or "
                f"a JAX platform name such as 'cuda' or 'tpu'; got {platform!r}"
            )
        self.platform = platform
        self._env = dict(env or {})
        environ = {**os.environ, **self._env}
        # Checked here, where a bad value is one clear error, not a scheduler's log.
        Config.from_env(environ).check_checkpoint_root()  # the hosts run on this machine
        # Each island's own GPUs, if it is to use GPUs (refused here if too few).
        self._island_envs = island_envs(platform, islands, devices_per_island, environ)
        in_use = _jax_platforms_in_use()
        warning = spare_the_hosts_gpus(
            self._island_envs,
            os.environ,
            gpu_in_use=bool(in_use & {"gpu", "cuda", "rocm"}),
            tpu_in_use="tpu" in in_use,
        )
        if warning is not None:
            warnings.warn(warning, RuntimeWarning, stacklevel=2)
        self._timeout = timeout
        # The cluster's distributed.Security when it runs with TLS (see _security).
        self.security: Any = cluster_security(security)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="pathways-cluster-")
        self.scheduler_address = ""
        self.controller_address = ""
        self.dashboard_link = ""
        self._closed = False
        try:
            self._start(dashboard)
        except BaseException:
            self.close()
            raise

    # lifecycle ------------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(_dask_tuning(env))
        env.update(self._env)
        return env

    def _tls_options(self, role: str) -> list[str]:
        if self.security is None:
            return []
        if role == "scheduler":
            write_client_files(self.security, self._tmp.name)
        return command_options(self.security, role, self._tmp.name)

    def _spawn(self, args: list[str], env: dict[str, str], log_name: str) -> None:
        log = open(os.path.join(self._tmp.name, log_name), "wb")  # noqa: SIM115
        p = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._procs.append(p)

    def _start(self, dashboard: bool) -> None:
        sched_file = os.path.join(self._tmp.name, "scheduler.json")
        self._spawn(
            [
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--dashboard-address",
                f"{self.host}:0" if dashboard else ":0",
                *([] if dashboard else ["--no-dashboard"]),
                "--scheduler-file",
                sched_file,
                "--preload",
                "pathways_nb.deploy.scheduler",
                *self._tls_options("scheduler"),
            ],
            {**self._base_env(), CLUSTER_DIR_ENV: self._tmp.name},
            "scheduler.log",
        )
        deadline = time.monotonic() + self._timeout
        while (info := _read_scheduler_file(sched_file)) is None:
            self._check_alive("the Dask scheduler")
            if time.monotonic() > deadline:
                raise BrokenError(
                    f"the Dask scheduler did not start within {self._timeout:.0f} s"
                    + self._logs_hint()
                )
            time.sleep(0.05)
        self.scheduler_address = info["address"]
        port = info.get("services", {}).get("dashboard")
        if dashboard and port:
            self.dashboard_link = f"http://{self.host}:{port}/status"
        wenv = self._base_env()
        if self.platform is not None:
            wenv["JAX_PLATFORMS"] = self.platform
        if self.platform == "cpu" or (self.platform is None and not any(self._island_envs)):
            # Simulated devices, or the CPU JAX falls back to without accelerators: as
            # many as the island asks for.
            wenv["PATHWAYS_CPU_DEVICES"] = str(self.devices_per_island)
            flags = wenv.get("XLA_FLAGS", "")
            wenv["XLA_FLAGS"] = (
                f"{flags} --xla_force_host_platform_device_count={self.devices_per_island}"
            ).strip()
        for i in range(self.islands):
            self._spawn(
                [
                    "-m",
                    "distributed.cli.dask_worker",
                    self.scheduler_address,
                    "--name",
                    f"island{i}",
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    "0",
                    "--death-timeout",
                    "20",
                    "--no-dashboard",
                    "--host",
                    self.host,
                    "--preload",
                    "pathways_nb.deploy.worker",
                    "--preload-nanny",
                    "pathways_nb.deploy.nanny",
                    *self._tls_options("worker"),
                ],
                {**wenv, **self._island_envs[i]},
                f"worker{i}.log",
            )
        self.wait_for_hosts(self.islands, deadline - time.monotonic())

    def wait_for_hosts(self, n: int, timeout: float = 60.0) -> None:
        """Block until the controller has ``n`` live hosts."""
        from pathways_nb.client._discovery import ask_scheduler

        deadline = time.monotonic() + timeout
        while True:
            self._check_alive("a cluster process")
            self._check_workers()
            try:
                # The scheduler's process is alive (checked above): no need to probe it.
                info: dict[str, Any] | None = ask_scheduler(
                    self.scheduler_address, 5, False, security=self.security
                )
            except BrokenError:
                info = None  # not up yet
            if info is not None:
                self.controller_address = info["address"]
                if info["live_hosts"] >= n:
                    return
            if time.monotonic() > deadline:
                raise BrokenError(
                    f"the cluster has {0 if info is None else info['live_hosts']} of {n} hosts "
                    f"after {timeout:.0f} s" + self._logs_hint()
                )
            time.sleep(0.1)

    def check_alive(self) -> None:
        """Raise :class:`BrokenError` (with the processes' logs) if the Dask scheduler,
        and with it the controller, has exited."""
        if self._closed:
            raise ClosedError("this LocalCluster was closed; start a new one")
        self._check_alive("the cluster's Dask scheduler (the controller's process)")

    def _check_alive(self, what: str) -> None:
        for p in self._procs[:1]:
            if p.poll() is not None:
                raise BrokenError(f"{what} exited with code {p.returncode}" + self._logs_hint())

    def _check_workers(self) -> None:
        """A ``dask worker`` command ends when its host cannot start (the preload closes
        the worker and its nanny): say so now, with the logs, not after the timeout."""
        for i, p in enumerate(self._procs[1:]):
            if p.poll() is not None:
                cause = _host_failure(self.logs().get(f"worker{i}", ""))
                raise BrokenError(
                    f"the Dask worker of island{i} exited with code {p.returncode} before "
                    "its pathways host registered"
                    + (f": {cause}" if cause else " (its log below may say why)")
                    + self._logs_hint()
                )

    def _logs_hint(self) -> str:
        tails = [
            f"--- {name}.log ---\n" + "\n".join(text.strip().splitlines()[-60:])
            for name, text in self.logs().items()
        ]
        return ("\n" + "\n".join(tails)) if tails else ""

    @property
    def logs_dir(self) -> str:
        """The folder of the processes' logs (``logs()`` reads them); removed on close,
        or by the scheduler if the process that started the cluster dies."""
        return self._tmp.name

    def logs(self) -> dict[str, str]:
        """The scheduler's and workers' output so far."""
        out = {}
        for name in sorted(os.listdir(self._tmp.name)):
            if name.endswith(".log"):
                with open(os.path.join(self._tmp.name, name), "rb") as f:
                    out[name[:-4]] = f.read().decode(errors="replace")
        return out

    @property
    def scheduler_pid(self) -> int:
        """Process id of the Dask scheduler, which hosts the controller."""
        return self._procs[0].pid

    def worker_pids(self) -> list[int]:
        """Process ids of the worker CLIs (nannies), one per island."""
        return [p.pid for p in self._procs[1:]]

    def close(self, timeout: float = 20.0) -> None:
        """Stop every process of the cluster. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Workers first (their nannies take the worker processes along), then the scheduler.
        for group in (self._procs[1:], self._procs[:1]):
            for p in group:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for p in group:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self._tmp.cleanup()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close(timeout=5)

    def _repr_html_(self) -> str:
        import html

        dash = (
            f' · <a href="{html.escape(self.dashboard_link)}" target="_blank">Dask dashboard</a>'
            if self.dashboard_link and not self._closed
            else ""
        )
        state = "closed" if self._closed else html.escape(self.scheduler_address)
        return (
            f"<b>pathways_nb.LocalCluster</b>: {counted(self.islands, 'island')} x "
            f"{counted(self.devices_per_island, html.escape(self.platform or 'auto') + ' device')}"
            f" at <code>{state}</code>{dash}"
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.scheduler_address
        dash = f", dashboard {self.dashboard_link}" if self.dashboard_link else ""
        return (
            f"<pathways_nb.LocalCluster {counted(self.islands, 'island')} x "
            f"{counted(self.devices_per_island, (self.platform or 'auto') + ' device')} "
            f"at {state}{dash}>"
        )


def _jax_platforms_in_use() -> set[str]:
    """The platforms of the devices JAX in this process has started (without starting
    any): a GPU's or a TPU's would hold what the cluster's hosts are given."""
    jax = sys.modules.get("jax")
    if jax is None:
        return set()
    try:
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            return set()
        return {d.platform for d in jax.devices()}
    except Exception:  # a JAX without these internals: nothing known, nothing said
        return set()
