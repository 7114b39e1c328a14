"""Clusters the Pathways panel starts and stops: each a ``pathways-nb cluster`` process
of the Jupyter server's, as Dask's JupyterLab extension starts its clusters.

A started cluster outlives the notebooks that use it (several kernels may connect to it,
as tenants) and ends when the panel stops it or the server exits. Its process watches
the server's, so even a killed server leaves no cluster behind. Nothing here imports
JAX or the client: starting one costs the server a child process, not an import.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

# A cluster's processes share this machine's cores: a few islands of a few simulated
# devices each are what it can run (a request past these is refused, not queued).
MAX_ISLANDS = 16
MAX_DEVICES = 64
# Clusters one server runs at once: each is several processes importing JAX.
MAX_STARTED = 4
# Seconds a cluster has to come up: its scheduler, controller and hosts start and
# register, each importing JAX.
START_SECONDS = 180.0
STOP_SECONDS = 30.0


@dataclass
class _Started:
    address: str
    islands: int
    devices: int
    platform: str
    process: subprocess.Popen[bytes]
    folder: str
    tls: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "islands": self.islands,
            "devices_per_island": self.devices,
            "platform": self.platform,
            "tls": self.tls,
            "pid": self.process.pid,
            # How the panel lists it: a cluster it may stop.
            "source": "started here",
            "stoppable": True,
        }


def check_tls(tls: object) -> bool:
    """Whether the cluster is to run with TLS; ValueError for what is not a boolean."""
    if not isinstance(tls, bool):
        raise ValueError(
            f"tls is true (every link over TLS, on certificates made for the cluster) or "
            f"false; got {tls!r}"
        )
    return tls


def check_size(islands: object, devices: object) -> tuple[int, int]:
    """The cluster's size as the panel asks for it; ValueError saying what is wrong."""
    out = []
    for name, value, most in (
        ("islands", islands, MAX_ISLANDS),
        ("devices_per_island", devices, MAX_DEVICES),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{name} is a whole number from 1 to {most}; got {value!r}")
        out.append(value)
    return out[0], out[1]


PLATFORMS = ("cpu", "auto")


def check_platform(platform: object) -> str:
    """``"cpu"`` (simulated devices) or ``"auto"`` (the accelerators each host finds),
    as ``pathways-nb cluster --platform`` takes them; ValueError otherwise."""
    if platform not in PLATFORMS:
        raise ValueError(
            f"platform is 'cpu' (simulated CPU devices) or 'auto' (the accelerators each "
            f"host finds: GPUs, TPUs); got {platform!r}"
        )
    return str(platform)


class Launched:
    """The clusters this server started, by scheduler address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[str, _Started] = {}

    def start(
        self,
        islands: object,
        devices: object,
        platform: object = "cpu",
        timeout: float = START_SECONDS,
        tls: object = False,
    ) -> dict[str, Any]:
        """Start a cluster of ``islands`` hosts with ``devices`` devices each (simulated
        CPU devices, or with ``platform="auto"`` the accelerators each host finds);
        return its address once every host is up. ValueError for a size or platform it
        does not take; RuntimeError, with the cluster's own words, when it fails to
        start."""
        n_islands, n_devices = check_size(islands, devices)
        kind = check_platform(platform)
        secure = check_tls(tls)
        running = self.running()
        if len(running) >= MAX_STARTED:
            raise ValueError(
                f"this server runs {len(running)} clusters it started already, the most it "
                f"starts ({', '.join(c['address'] for c in running)}): stop one first, or "
                "connect another notebook to one of them"
            )
        folder = tempfile.mkdtemp(prefix="pathways-panel-")
        info_file = os.path.join(folder, "scheduler.json")
        log_path = os.path.join(folder, "cluster.log")
        command = [
            sys.executable,
            "-m",
            "pathways_nb.deploy._cli",
            "cluster",
            "--islands",
            str(n_islands),
            "--devices",
            str(n_devices),
            "--platform",
            kind,
            "--scheduler-file",
            info_file,
            "--no-dashboard",
            *(["--tls"] if secure else []),
        ]
        # The cluster watches this server, and removes its folder if the server dies.
        env = {
            **os.environ,
            "PATHWAYS_PARENT_PID": str(os.getpid()),
            "PATHWAYS_CLUSTER_DIR": folder,
        }
        with open(log_path, "wb") as log:
            # A session of its own: a Ctrl-C at the server's terminal is the server's.
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError, KeyError):
                with open(info_file) as f:
                    address = json.load(f)["address"]
                break
            if process.poll() is not None:
                text = _tail(log_path)
                shutil.rmtree(folder, ignore_errors=True)
                raise RuntimeError(
                    f"the cluster of {n_islands} islands x {n_devices} {kind} devices failed to "
                    f"start (exit status {process.returncode}): {text}"
                )
            if time.monotonic() > deadline:
                _end(process)
                text = _tail(log_path)
                shutil.rmtree(folder, ignore_errors=True)
                raise RuntimeError(
                    f"the cluster of {n_islands} islands x {n_devices} {kind} devices did not "
                    f"come up within {timeout:.0f} s; stopped it. Its output: {text}"
                )
            time.sleep(0.1)
        started = _Started(address, n_islands, n_devices, kind, process, folder, secure)
        with self._lock:
            self._started[address] = started
        return started.to_dict()

    def stop(self, address: str) -> bool:
        """Stop the cluster this server started at ``address``; False if it started
        none there (another's clusters are not the panel's to stop)."""
        with self._lock:
            started = self._started.pop(address, None)
        if started is None:
            return False
        _end(started.process)
        shutil.rmtree(started.folder, ignore_errors=True)
        return True

    def running(self) -> list[dict[str, Any]]:
        """The clusters started here that are still up, oldest first (one that ended
        on its own is forgotten)."""
        with self._lock:
            ended = [a for a, s in self._started.items() if s.process.poll() is not None]
            for a in ended:
                shutil.rmtree(self._started.pop(a).folder, ignore_errors=True)
            return [s.to_dict() for s in self._started.values()]

    def close(self) -> None:
        """Stop every cluster started here (the server is exiting)."""
        with self._lock:
            addresses = list(self._started)
        for a in addresses:
            self.stop(a)


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, which ``pathways-nb cluster`` answers by closing its cluster; then, if it
    has not ended within STOP_SECONDS, SIGKILL to its whole session."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return "(no output)"
    return text[-limit:] or "(no output)"
