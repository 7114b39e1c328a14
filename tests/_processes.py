"""Waiting for real processes to end, for the tests that kill or stop them."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil


def gone(pids: list[int], timeout: float) -> bool:
    """Whether every process of ``pids`` has ended (zombies count as ended) within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def wait_for_file(path: Path, proc: subprocess.Popen[Any], timeout: float) -> Any:
    """The JSON a command writes to ``path`` once it is ready (a scheduler file), failing
    if the command exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the command exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.1)
    return json.loads(path.read_text())
