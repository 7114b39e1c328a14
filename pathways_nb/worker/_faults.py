"""Fault injection for tests: the next launch of a program whose name matches fails,
waits, or ends the host's process, as a real fault would."""

from __future__ import annotations

import logging
import os
import time

from pathways_nb._core import RemoteError

log = logging.getLogger("pathways_nb.worker")


class Faults:
    """Armed faults, each ``(match, kind)``: ``"error"``, ``"crash"`` or ``"delay:S"``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._armed: list[tuple[str, str]] = []

    def __bool__(self) -> bool:
        return bool(self._armed)

    def arm(self, match: str, kind: str) -> None:
        self._armed.append((match, kind))

    def take(self, name: str) -> None:
        """Take the first fault armed for ``name``: raise it, wait it out, or exit."""
        i = next((i for i, (match, _) in enumerate(self._armed) if match in name), None)
        if i is None:
            return
        _, kind = self._armed.pop(i)
        if kind == "crash":
            log.error("fault injection: host %s exits now", self.host)
            os._exit(17)
        if kind.startswith("delay:"):
            # Holds this host's queue, as a slow program would: tests use it to observe
            # queueing, back-pressure and cancellation deterministically.
            time.sleep(float(kind.split(":", 1)[1]))
            return
        raise RemoteError("injected fault", kind="fault_injected")
