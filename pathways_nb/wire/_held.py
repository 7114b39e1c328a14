"""Ctrl-C held back while the main thread is inside a connection's bookkeeping.

A stream connection keeps what it has sent and received in Python: a send is a system
call followed by the count of the bytes the kernel took, a receive the same the other
way. Python runs a SIGINT handler in the main thread at the first instruction after a
system call returns, so "interrupt kernel" during a burst of launches lands there most
of the time (in a loop of sends on a socket pair, 200 interrupts of 200 fell between a
send and its count). The sent bytes are then counted as waiting and go again, or the
received ones are never counted: the controller sees a launch twice, or a fetch from
that host waits for ever.

A client turns this on (:func:`hold_interrupts_in_main_thread`): from then on the main
thread's sections of a connection's bookkeeping hold a SIGINT that comes meanwhile and
hand it to the handler that was installed (``KeyboardInterrupt`` by default) as soon as
the section ends. The handler is wrapped, not replaced: a kernel that installs its own
for each cell (ipykernel does) gets wrapped again at the next section, at the cost of
one ``signal.signal`` call per cell. Other threads, and processes that never turn it
on (controllers, hosts), are untouched.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module under signal
import signal
import threading
from collections.abc import Callable
from typing import Any

Handler = Callable[[int, Any], Any]
# signal.getsignal turns its answer into an enum member: 1.6 µs a call here, against
# 0.04 for the C function under it, and it is asked on every launch.
_getsignal = _signal.getsignal
_SIGINT = int(signal.SIGINT)


class _Held:
    def __init__(self) -> None:
        self.enabled = False
        self.main = threading.main_thread().ident
        self.depth = 0
        self.pending: tuple[int, Any] | None = None
        self.previous: Handler | None = None
        self.handler: Handler | None = None  # ours, while it is the one installed

    def enter(self) -> bool:
        """Start a section; False (and nothing to end) outside the main thread or
        before a client turned holding on."""
        if not self.enabled or threading.get_ident() != self.main:
            return False
        if self.depth == 0 and _getsignal(_SIGINT) is not self.handler:
            self._wrap()
        self.depth += 1
        return True

    def exit(self) -> None:
        """End a section; a SIGINT held during it is handled now."""
        self.depth -= 1
        if self.depth == 0 and self.pending is not None:
            signum, frame = self.pending
            self.pending = None
            previous = self.previous
            if previous is not None:
                previous(signum, frame)

    def _wrap(self) -> None:
        current = _getsignal(_SIGINT)
        if not callable(current):
            # SIG_DFL, SIG_IGN, or a handler set from C: left as it is.
            self.handler = None
            return
        previous: Handler = current

        def held(signum: int, frame: Any) -> Any:
            if self.depth:
                self.pending = (signum, frame)
                return None
            return previous(signum, frame)

        self.previous = previous
        self.handler = held
        signal.signal(signal.SIGINT, held)


HELD = _Held()


class interrupts_deferred:
    """A section of the main thread's own bookkeeping that Ctrl-C must not cut in two,
    such as a launch's (noted as pending, sent, its outputs made): a SIGINT meanwhile
    is handled once the block ends. Cheap (no system call), so fit for every launch;
    does nothing until a client turned holding on, and outside the main thread."""

    __slots__ = ("_held",)

    def __enter__(self) -> None:
        self._held = HELD.enter()

    def __exit__(self, *exc: object) -> None:
        if self._held:
            HELD.exit()


def hold_interrupts_in_main_thread() -> None:
    """From now on, Ctrl-C waits for the end of a connection's bookkeeping in the main
    thread (see the module's doc). Safe to call more than once, from any thread."""
    HELD.enabled = True
