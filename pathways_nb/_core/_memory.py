"""Moves of arrays that this machine's memory cannot take are refused before they start.

A fetch lands in the notebook's process; a put, or a transfer, to a host on this machine
is copied into that host's process. Any of them, too large, makes the kernel's OOM
killer end a process part way through (the largest: often a host, with every slice on it).
"""

from __future__ import annotations

from typing import NamedTuple

import psutil

from pathways_nb._core._errors import ResourceExhaustedError

# Smaller moves and programs are not checked: reading the free memory costs ~30 µs, as
# much as a small fetch's or launch's own work, and so small a one fails only where
# memory is all but gone anyway.
CHECK_FROM = 64 << 20
_GIB = 2**30


class Memory(NamedTuple):
    """The machine's memory now: ``spare`` is what may still be taken, leaving a
    reserve for everything else on the machine (its processes' own Python, transfers)."""

    total: int
    available: int
    spare: int

    def __str__(self) -> str:
        return f"{self.available / _GIB:.2f} GiB available of {self.total / _GIB:.2f} GiB"


def machine_memory() -> Memory:
    memory = psutil.virtual_memory()
    reserve = max(256 << 20, memory.total // 20)
    return Memory(memory.total, memory.available, memory.available - reserve)


def check_fits(
    need: int,
    doing: str,
    instead: str,
    program: str | None = None,
    slice: str | None = None,
    host: str | None = None,
    to: str | None = None,
) -> None:
    """Raise ResourceExhaustedError if ``need`` more bytes would not fit in this
    machine's memory; ``doing`` says what needs them, ``instead`` what to do; the error
    names ``program``, ``slice`` and ``host`` where given. ``to``: the address of the
    host the bytes go to, when they leave this process; a host on another machine is
    not this machine's to check."""
    if need < CHECK_FROM or (to is not None and not on_this_machine(to)):
        return
    memory = machine_memory()
    if need <= memory.spare:
        return
    raise ResourceExhaustedError(
        f"{doing} needs {need / _GIB:.2f} GiB more of this machine's memory: {memory}. {instead}",
        program=program,
        slice=slice,
        host=host,
    )


def on_this_machine(address: str) -> bool:
    """Whether a host's data address is on this machine (a Unix socket or loopback)."""
    return address.startswith(
        ("ipc://", "inproc://", "tcp://127.", "tcp://localhost:", "tcp://[::1]")
    )
