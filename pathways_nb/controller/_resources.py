"""The resource manager: hosts, islands, devices and virtual slices, as a state machine.

Events in (a host registers, a client allocates or releases, a host is lost), decisions
out (which physical devices back a virtual slice, and where a lost slice goes once a host
with room for it registers). No sockets, no threads.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

from pathways_nb._core import BusyError, ClosedError, DataLossError, ResourceExhaustedError


@dataclasses.dataclass
class HostInfo:
    host: str
    island: str
    devices: list[int]
    data_address: str
    process: str
    platform: str
    alive: bool = True
    # PATHWAYS_STORE_LIMIT_BYTES of the host (0: none).
    store_limit: int = 0

    def bounded(self, tenant_store_bytes: int) -> bool:
        """Whether what a tenant keeps here is bounded, by the host's own limit or by
        the quota every tenant has (``tenant_store_bytes``; 0: none)."""
        return bool(self.store_limit or tenant_store_bytes)


@dataclasses.dataclass
class SliceInfo:
    slice: str
    name: str
    tenant: int
    mesh: dict[str, int]
    island: str
    host: str
    devices: list[int]
    state: str = "active"  # active | released | lost
    # The mesh axes' jax.sharding.AxisType names, as the client allocated them.
    axis_types: list[str] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return math.prod(self.mesh.values())

    def to_dict(self) -> dict[str, Any]:
        # Shallow copies: dataclasses.asdict deep-copies field by field, and status
        # snapshots build one per slice on the controller thread.
        return {
            **vars(self),
            "mesh": dict(self.mesh),
            "devices": list(self.devices),
            "axis_types": list(self.axis_types),
        }


class ResourceManager:
    """Maps virtual slices onto free devices of one island."""

    # Released slices remembered, so that a late request naming one hears "released"
    # rather than "does not exist"; the oldest are forgotten beyond this many.
    REMEMBER_RELEASED = 10_000

    def __init__(self) -> None:
        self.hosts: dict[str, HostInfo] = {}
        # Slices that still hold devices or are lost and not yet released: a long-lived
        # cluster allocates and releases without end, and what is gone must not make
        # every allocation (or a tenant's departure) walk all that ever was.
        self.slices: dict[str, SliceInfo] = {}
        self._gone: collections.OrderedDict[str, SliceInfo] = collections.OrderedDict()
        self._used: dict[str, set[int]] = {}  # host -> device ids held by active slices
        # Lost slices waiting for devices, oldest loss first: slice -> its platform.
        self._lost: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._next_slice = 0

    # events -------------------------------------------------------------------------
    def add_host(self, info: HostInfo) -> None:
        """A host registered (or re-registered after a restart under the same name)."""
        old = self.hosts.get(info.host)
        if old is not None and old.alive:
            self.lose_host(info.host)
        self.hosts[info.host] = info
        self._used[info.host] = set()

    def lose_host(self, host: str) -> list[SliceInfo]:
        """The host died: its active slices are lost. Returns them."""
        info = self.hosts.get(host)
        if info is None or not info.alive:
            return []
        info.alive = False
        lost = [s for s in self.slices.values() if s.host == host and s.state == "active"]
        for s in lost:
            s.state = "lost"
            self._lost[s.slice] = info.platform
        self._used[host] = set()
        return lost

    def remap_lost(self) -> list[SliceInfo]:
        """Lost slices move onto free devices of a live island of their platform (the
        one they were on, restarted, first; then as :meth:`allocate` spreads), oldest
        loss first. Returns the slices moved, active again on their new devices."""
        moved = []
        for sid, platform in list(self._lost.items()):
            s = self.slices.get(sid)
            if s is None or s.state != "lost":
                del self._lost[sid]
                continue
            host = self._place(s.size, platform, prefer=s.island)
            if host is None:
                continue
            del self._lost[sid]
            info = self.hosts[host]
            s.devices = self._take(host, s.size)
            s.host, s.island, s.state = host, info.island, "active"
            moved.append(s)
        return moved

    def _place(self, need: int, platform: str | None, prefer: str = "") -> str | None:
        """The live host to place ``need`` devices on (see :meth:`allocate`), or None."""
        candidates = []
        for h in self.hosts.values():
            if not h.alive or (platform is not None and h.platform != platform):
                continue
            free = len(h.devices) - len(self._used[h.host])
            if free >= need:
                load = sum(
                    1 for s in self.slices.values() if s.host == h.host and s.state == "active"
                )
                candidates.append((h.island != prefer, load, -free, h.host))
        return min(candidates)[-1] if candidates else None

    def _take(self, host: str, need: int) -> list[int]:
        info = self.hosts[host]
        ids = [d for d in info.devices if d not in self._used[host]][:need]
        self._used[host].update(ids)
        return ids

    def allocate(
        self,
        tenant: int,
        mesh: dict[str, int],
        name: str | None,
        max_devices: int = 0,
        axis_types: list[str] | None = None,
    ) -> SliceInfo:
        """Place a virtual slice of shape ``mesh`` on free devices of one island
        (``axis_types``: its axes' AxisType names, for the status tables).

        Slices spread: among the islands with room, the one holding the fewest active
        slices wins, then the one with the most free devices. ``max_devices`` (0: none)
        bounds the devices the tenant's slices hold together, lost ones included.
        """
        need = math.prod(mesh.values())
        if name is not None:
            for s in self.slices.values():
                if s.tenant == tenant and s.name == name and s.state == "active":
                    raise ValueError(
                        f"this client already has an active slice named {name!r}; "
                        "release it first or choose another name"
                    )
        if max_devices and (held := self.held(tenant)) + need > max_devices:
            mine = [s for s in self.slices.values() if s.tenant == tenant]
            which = ", ".join(
                f"{s.name} ({s.size}{', lost' if s.state == 'lost' else ''})" for s in mine
            )
            raise ResourceExhaustedError(
                f"mesh {mesh} needs {need} devices, and this client holds {held} "
                f"({which or 'none'}) of the {max_devices} devices one client may hold on "
                "this cluster (PATHWAYS_TENANT_MAX_DEVICES, set where the controller runs). "
                "Release a slice (vs.release()), ask for a smaller mesh, or ask the "
                "cluster's operator to raise the quota."
            )
        host = self._place(need, None)
        if host is None:
            raise BusyError(
                f"no island has {need} free devices for mesh {mesh}; free devices per island: "
                f"{self.free_summary() or 'none (no live hosts)'}. Release a slice, ask for a "
                "smaller mesh, or add hosts."
            )
        info = self.hosts[host]
        free_ids = self._take(host, need)
        self._next_slice += 1
        sid = f"s{self._next_slice}"
        s = SliceInfo(
            slice=sid,
            name=name or sid,
            tenant=tenant,
            mesh=dict(mesh),
            island=info.island,
            host=host,
            devices=free_ids,
            axis_types=list(axis_types or ()),
        )
        self.slices[sid] = s
        return s

    def release(self, sid: str, tenant: int) -> SliceInfo:
        """Free the slice's devices (a lost one keeps its state). Releasing twice is a
        no-op."""
        s = self.get(sid, tenant)
        if s.state == "active":
            self._used[s.host].difference_update(s.devices)
            s.state = "released"
        if self.slices.pop(sid, None) is not None:
            self._gone[sid] = s
            while len(self._gone) > self.REMEMBER_RELEASED:
                self._gone.popitem(last=False)
        return s

    def forget_tenant(self, tenant: int) -> None:
        """The tenant left (its active slices were released): its lost ones go too."""
        for sid in [sid for sid, s in self.slices.items() if s.tenant == tenant]:
            self.release(sid, tenant)

    # queries ------------------------------------------------------------------------
    def held(self, tenant: int) -> int:
        """Devices the tenant's slices hold: active ones, and lost ones waiting to be
        remapped (they take devices again when they are)."""
        return self.held_by_tenant().get(tenant, 0)

    def held_by_tenant(self) -> dict[int, int]:
        """:meth:`held` of every tenant with slices, in one pass."""
        out: dict[int, int] = {}
        for s in self.slices.values():
            out[s.tenant] = out.get(s.tenant, 0) + s.size
        return out

    def get(self, sid: str, tenant: int | None = None) -> SliceInfo:
        s = self.slices.get(sid) or self._gone.get(sid)
        if s is None or (tenant is not None and s.tenant != tenant):
            raise ClosedError(f"slice {sid!r} does not exist for this client")
        return s

    def active(self, sid: str, tenant: int) -> SliceInfo:
        """The slice if it can run programs now; a clear error otherwise."""
        s = self.get(sid, tenant)
        if s.state == "released":
            raise ClosedError(f"slice {s.name!r} was released; allocate a new one")
        if s.state == "lost":
            raise DataLossError(
                f"slice {s.name!r} was lost with host {s.host}", slice=s.name, host=s.host
            )
        return s

    def free_summary(self) -> str:
        parts = []
        for h in self.hosts.values():
            if h.alive:
                parts.append(
                    f"{h.island}: {len(h.devices) - len(self._used[h.host])}/{len(h.devices)}"
                )
        return ", ".join(parts)

    def snapshot(self) -> dict[str, Any]:
        # Every live host; a dead one only while no live host serves its island, and then
        # the last of them: a cluster whose workers restart now and then must not list
        # each process that ever served an island.
        serving = {h.island for h in self.hosts.values() if h.alive}
        last_dead = {h.island: h for h in self.hosts.values() if not h.alive}
        hosts = []
        for h in self.hosts.values():
            if not h.alive and (h.island in serving or last_dead[h.island] is not h):
                continue
            d = {**vars(h), "devices": list(h.devices)}
            d["used"] = sorted(self._used.get(h.host, ()))
            hosts.append(d)
        return {
            "hosts": hosts,
            "slices": [s.to_dict() for s in self.slices.values()],
        }
