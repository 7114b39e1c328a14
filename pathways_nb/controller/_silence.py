"""How long each host has been silent, counted only while the controller could listen.

A host is lost after ``timeout`` seconds without a message (a client's lease lapses the
same way). When the controller's own thread does not turn for a while (its process
starved of the interpreter's lock by a long native call, or the whole machine paused, as
a virtual machine can be), messages wait unread, and on waking it would find every host
and client "silent" for as long as it was itself away. The time the controller was kept
from turning (past :data:`LATE`) is therefore counted against nobody. A plain state
machine, used by the controller's thread alone.
"""

from __future__ import annotations

# Seconds the controller may be late turning before the time counts as its own absence:
# well above a turn's own work, well below a host's timeout.
LATE = 1.0


class Silences:
    """The monotonic time of each host's last message, with the controller's absences
    left out."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def heard(self, host: str, now: float) -> None:
        """``host`` said something at ``now``."""
        self._seen[host] = now

    def forget(self, host: str) -> None:
        self._seen.pop(host, None)

    def away(self, seconds: float) -> None:
        """The controller could not listen for ``seconds``: not the hosts' silence."""
        for host in self._seen:
            self._seen[host] += seconds

    def silent(self, now: float, timeout: float) -> list[str]:
        """The hosts not heard from for more than ``timeout`` seconds."""
        return [h for h, seen in self._seen.items() if now - seen > timeout]
