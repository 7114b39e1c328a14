"""Waiting for real processes to end, for the tests that kill or stop them."""

from __future__ import annotations

import time

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
