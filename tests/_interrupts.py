"""Pressing "interrupt kernel" while the main thread waits, for the tests of what
Ctrl-C cancels."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pathways_nb as pw


@contextlib.contextmanager
def interrupted_when_blocked_in(function: str, module: str = "") -> Iterator[None]:
    """Press "interrupt kernel" once the main thread is blocked inside ``function``
    (of the file whose path ends with ``module``, where given: Python's own threading
    has a ``wait`` too).

    The interrupt is SIGINT as Python sees it (``_thread.interrupt_main``), handled by
    raising KeyboardInterrupt in the main thread as a kernel's handler does, whatever
    handler or signal mask a library used by an earlier test left in this process. Our
    waits wake every 100 ms to let it through, as they must for a real SIGINT too.
    """
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        deadline = time.monotonic() + 10
        while not _blocked_in(main, function, module) and time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main(signal.SIGINT)
        # A KeyboardInterrupt raised while a weakref callback or __del__ runs is swallowed
        # (Python prints it as unraisable), as a real Ctrl-C there would be: press again
        # while the main thread still waits in ``function`` and has not begun cancelling.
        while time.monotonic() < deadline:
            time.sleep(0.3)
            cancelling = _blocked_in(main, "cancel") or _blocked_in(main, "_cancel")
            if cancelling or not _blocked_in(main, function, module):
                return
            _thread.interrupt_main(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t = threading.Thread(target=interrupt)
    t.start()
    try:
        yield
    finally:
        t.join()
        signal.signal(signal.SIGINT, previous)


def _blocked_in(thread_id: int, function: str, module: str = "") -> bool:
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        code = frame.f_code
        if code.co_name == function and code.co_filename.endswith(module):
            return True
        frame = frame.f_back
    return False


def outcomes(client: pw.Client, outs: list[pw.RemoteArray]) -> set[str]:
    client.wait_all(timeout=30)
    kinds = set()
    for o in outs:
        try:
            o.fetch()
            kinds.add("ok")
        except pw.RemoteError as exc:
            kinds.add(exc.kind)
    return kinds


class SigintAfter:
    """A connection's socket that raises SIGINT in this (the main) thread right after
    each call of ``name`` returns, as "interrupt kernel" does most of the time."""

    def __init__(self, sock: Any, name: str) -> None:
        self._sock, self._name = sock, name

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self._sock, attr)
        if attr != self._name:
            return real

        def then_sigint(*args: Any) -> Any:
            out = real(*args)
            signal.raise_signal(signal.SIGINT)
            return out

        return then_sigint


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C in the main thread handled as a client's process handles it (see
    ``wire._held``), and as before again afterwards."""
    from pathways_nb.wire import _held, hold_interrupts_in_main_thread

    before = signal.getsignal(signal.SIGINT)
    hold_interrupts_in_main_thread()
    try:
        yield
    finally:
        _held.HELD.enabled = False
        signal.signal(signal.SIGINT, before)
