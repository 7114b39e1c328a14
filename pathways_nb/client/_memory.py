"""Moves of arrays that this machine's memory cannot take are refused before they start.

A fetch lands in the notebook's process; a put to a host on this machine is copied into
that host's process. Either, too large, makes the kernel's OOM killer end a process part
way through (the largest: often the host, with every slice on it).
"""

from __future__ import annotations

import psutil

from pathways_nb._core import ResourceExhaustedError

# Moves smaller than this are not checked: reading the free memory costs ~30 µs, as much
# as a small fetch's own work, and so small a move fails only where memory is gone anyway.
CHECK_FROM = 64 << 20
_GIB = 2**30


def check_fits(need: int, doing: str, instead: str) -> None:
    """Raise ResourceExhaustedError if ``need`` more bytes would not fit in this
    machine's available memory; ``doing`` says what needs them, ``instead`` what to do."""
    if need < CHECK_FROM:
        return
    memory = psutil.virtual_memory()
    reserve = max(256 << 20, memory.total // 20)
    if need <= memory.available - reserve:
        return
    raise ResourceExhaustedError(
        f"{doing} needs {need / _GIB:.2f} GiB more of this machine's memory: "
        f"{memory.available / _GIB:.2f} GiB available of {memory.total / _GIB:.2f} GiB. "
        f"{instead}"
    )


def on_this_machine(address: str) -> bool:
    """Whether a host's data address is on this machine (a Unix socket or loopback)."""
    return address.startswith(
        ("ipc://", "inproc://", "tcp://127.", "tcp://localhost:", "tcp://[::1]")
    )
