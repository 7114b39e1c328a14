"""Tenants: one per connected client; the unit of fair sharing and of leases."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Tenant:
    tenant: int
    identity: bytes
    name: str
    weight: float = 1.0
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    launches: int = 0
    pending: int = 0
    device_seconds: float = 0.0
    # A read-only client (a dashboard): status and events only, never listed or weighed.
    observer: bool = False


class Tenants:
    """Assigns tenant ids and tracks leases."""

    def __init__(self) -> None:
        self.by_id: dict[int, Tenant] = {}
        self.by_identity: dict[bytes, Tenant] = {}
        self._next = 0

    def add(
        self, identity: bytes, name: str, weight: float = 1.0, observer: bool = False
    ) -> Tenant:
        old = self.by_identity.get(identity)
        if old is not None:
            return old
        self._next += 1
        t = Tenant(self._next, identity, name or f"tenant-{self._next}", weight, observer=observer)
        self.by_id[t.tenant] = t
        self.by_identity[identity] = t
        return t

    def remove(self, tenant: int) -> Tenant | None:
        t = self.by_id.pop(tenant, None)
        if t is not None:
            self.by_identity.pop(t.identity, None)
        return t

    def away(self, seconds: float) -> None:
        """The controller could not listen for ``seconds``: not the clients' silence."""
        for t in self.by_id.values():
            t.last_seen += seconds

    def expired(self, lease_seconds: float, now: float | None = None) -> list[Tenant]:
        now = time.monotonic() if now is None else now
        return [t for t in self.by_id.values() if now - t.last_seen > lease_seconds]
