"""Ctrl-C ("interrupt kernel") held back while JAX traces and lowers a program.

An interrupt that lands inside JAX's first lowering in a process leaves its MLIR
context half set up: every later trace in that process then fails with "Dialect
namespace 'mhlo' is already registered", and only a kernel restart recovers. A program
is traced once per new shape, so holding the interrupt until the trace is done costs
a Ctrl-C at most one trace's time; it is raised as soon as the trace ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, SIGINT is remembered instead of raised; on leaving it, the
    handler that was there before runs (KeyboardInterrupt, by default). Signals reach
    only the main thread, so elsewhere this does nothing. Nesting is fine: an inner
    block hands a held interrupt on to the outer one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[Any] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler installed from C: it stays as it is
        yield
        return
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(signal.SIGINT, held[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt
