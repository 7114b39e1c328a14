"""Fault injection for tests: the next launch of a program whose name matches fails,
waits, or ends the host's process, as a real fault would. A fault is armed by one tenant
and taken only by that tenant's launches: no client can fail another's programs."""

from __future__ import annotations

import logging
import os
import time

from pathways_nb._core import RemoteError

log = logging.getLogger("pathways_nb.worker")


class Faults:
    """Armed faults, each ``(match, kind, tenant)``; kind ``"error"``, ``"crash"`` or
    ``"delay:S"``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._armed: list[tuple[str, str, int]] = []

    def __bool__(self) -> bool:
        return bool(self._armed)

    def arm(self, match: str, kind: str, tenant: int) -> None:
        self._armed.append((match, kind, tenant))

    def take(self, name: str, tenant: int) -> None:
        """Take the first fault ``tenant`` armed for ``name``: raise it, wait it out, or
        exit."""
        i = next((i for i, (m, _, t) in enumerate(self._armed) if t == tenant and m in name), None)
        if i is None:
            return
        _, kind, _ = self._armed.pop(i)
        if kind == "crash":
            log.error("fault injection: host %s exits now", self.host)
            os._exit(17)
        if kind.startswith("delay:"):
            # Holds this host's queue, as a slow program would: tests use it to observe
            # queueing, back-pressure and cancellation deterministically.
            time.sleep(float(kind.split(":", 1)[1]))
            return
        raise RemoteError("injected fault", kind="fault_injected")
