"""Ctrl-C ("interrupt kernel") held back while JAX traces and lowers a program.

An interrupt that lands inside JAX's first lowering in a process leaves its MLIR
context half set up: every later trace in that process then fails with "Dialect
namespace 'mhlo' is already registered", and only a kernel restart recovers. A program
is traced once per new shape, so holding the interrupt until the trace is done costs
a Ctrl-C at most one trace's time; it is raised as soon as the trace ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pathways_nb.wire import hold_interrupts_in_main_thread, interrupts_deferred


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, SIGINT is remembered instead of raised; on leaving it, the
    handler that was there before runs (KeyboardInterrupt, by default). Signals reach
    only the main thread, so elsewhere this does nothing. Nesting is fine: the
    outermost block hands a held interrupt on. The same sections as a client's launches
    (see ``pathways_nb.wire._held``), turned on here too for traces made without one."""
    hold_interrupts_in_main_thread()
    with interrupts_deferred():
        yield
