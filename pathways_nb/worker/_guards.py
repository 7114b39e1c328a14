"""Launches that would end the host's process are refused before they run, and fail as
values instead.

Memory: a CPU device's memory is the machine's own. XLA allocates a program's outputs
and temporaries with ``malloc``, and when they do not fit, the kernel's OOM killer ends
the whole host process (every slice on it is lost) where an accelerator would raise
RESOURCE_EXHAUSTED and carry on. So a CPU host compares what a program allocates (XLA's
memory analysis of the compiled executable, per device, times the devices, which all
draw on the same memory) with what the machine has available before it dispatches the
launch, and fails the launch with a :class:`ResourceExhaustedError` instead.

Donation: a donated input passed again in the same launch would be read after XLA may
have overwritten it; XLA's CPU client ends the process on it. The client refuses such a
call; a launch that still arrives so fails here.
"""

from __future__ import annotations

import threading
from typing import Any

from pathways_nb._core import RemoteError, ResourceExhaustedError, donated_twice, machine_memory


def program_bytes(executable: Any, devices: int) -> int:
    """Bytes a compiled program allocates when it runs on ``devices`` devices: its outputs
    and temporaries, less the outputs that reuse donated inputs' buffers. 0 when XLA
    gives no memory analysis."""
    try:
        stats = executable.memory_analysis()
    except Exception:  # not every backend or executable type offers it
        return 0
    if stats is None:
        return 0
    per_device = stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    # A StableHLO program from the proxy may run on some of the slice's devices only.
    ran_on = getattr(executable, "devices", None)
    return max(0, int(per_device)) * (len(ran_on) if ran_on else devices)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class MemoryGuard:
    """Refuses launches whose allocations the machine's memory cannot hold (CPU hosts).

    A launch it lets run holds its bytes until it finishes: XLA allocates as it runs, so
    the machine's available memory does not yet show what launches dispatched before it
    will take. Called from the dispatching threads and the completion thread.
    """

    def __init__(self, host: str, enabled: bool) -> None:
        self.host = host
        self.enabled = enabled
        self.refused = 0
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes held for launches dispatched and not yet finished."""
        return self._held

    def reserve(self, need: int, program: str, slice_name: str) -> None:
        """Hold ``need`` bytes for a launch, or raise ResourceExhaustedError if they would
        not fit now beside what running launches hold; :meth:`release` gives them back."""
        if not self.enabled:
            return
        memory = machine_memory()
        with self._lock:
            if need + self._held <= memory.spare:
                self._held += need
                return
            held = self._held
        self.refused += 1
        running = f", of which launches still running will take {_gib(held)}" if held else ""
        raise ResourceExhaustedError(
            f"program {program!r} on slice {slice_name!r} would allocate {_gib(need)} for its "
            f"outputs and temporaries on host {self.host}, whose CPU devices share the "
            f"machine's memory: {memory}{running}. "
            "The operating system would end the host; the launch was refused instead. "
            "Make the arrays smaller, shard replicated outputs over the slice's devices "
            "(each device holds its own copy of a replicated array), or free arrays you no "
            "longer need (`del x` or `x.delete()`)"
        )

    def release(self, nbytes: int) -> None:
        if self.enabled:
            with self._lock:
                self._held -= nbytes


def check_donation(ins: list[int], donate: tuple[int, ...]) -> None:
    """Raise RemoteError if a donated input is also another input of the launch."""
    twice = donated_twice(ins, donate)
    if twice is not None:
        i, count = twice
        raise RemoteError(
            f"input {ins[i]:#x} is donated and passed {count} times in one launch; a "
            "donated buffer cannot also be read as another input",
            kind="invalid",
        )
