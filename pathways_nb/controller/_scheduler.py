"""The gang scheduler: one ordered queue per island, fair between tenants.

Every program on an island leaves through this one queue, so all of the island's
devices see programs in the same order and collectives cannot deadlock. A bounded
window caps launches in flight per XLA process (several in-process hosts share one
process's rendezvous and thread pool). Between tenants the next launch on an island goes
to the tenant with the smallest *pass* there (stride scheduling): each launch advances
its tenant's pass on that island by its estimated device time divided by the tenant's
weight. Passes are per island: tenants share each island they contend for by weight,
and what a tenant runs on other islands (the other stages of its pipeline, say) does
not cost it its share of this one.

Finding that tenant costs O(log T) for T tenants, not a scan: each island keeps a heap of
its queued tenants by pass. Passes only grow, so entries are refreshed lazily: one whose
pass is out of date is at most the true value, and is re-pushed with the true one when
it reaches the top.

A plain state machine: ``submit``/``complete``/``cancel`` in, dispatch lists out.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass
class Work:
    """One unit the scheduler orders: a program launch or a batch of deletions."""

    kind: str  # "run" | "drop" | "send" | "recv" | "note" (only runs take a window slot)
    tenant: int
    island: str
    lid: int  # launch id; 0 for drops
    cost_key: str = ""
    body: Any = None


@dataclasses.dataclass
class _IslandQueue:
    window_key: str
    queues: dict[int, collections.deque[Work]] = dataclasses.field(default_factory=dict)
    # (pass, arrival, tenant) per tenant with an entry; arrival breaks ties in the order
    # tenants' queues appeared here.
    heap: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)
    in_heap: set[int] = dataclasses.field(default_factory=set)
    # Tenants whose next work here needs no window slot (a deletion or a transfer).
    free_heads: set[int] = dataclasses.field(default_factory=set)
    # Each tenant's pass here. A competition lasts while some tenant has work queued
    # here; each starts with every tenant level, at the largest pass there was (see
    # GangScheduler._join), and ``joined`` says in which one a tenant last joined.
    passes: dict[int, float] = dataclasses.field(default_factory=dict)
    max_pass: float = 0.0
    level: float = 0.0
    competition: int = 0
    joined: dict[int, int] = dataclasses.field(default_factory=dict)

    def empty(self) -> bool:
        return not self.queues  # a tenant's queue is removed when it empties

    def head_changed(self, tenant: int) -> None:
        dq = self.queues.get(tenant)
        if dq and dq[0].kind != "run":
            self.free_heads.add(tenant)
        else:
            self.free_heads.discard(tenant)


@dataclasses.dataclass(frozen=True)
class SchedulerStatistics:
    queued: dict[str, int]
    inflight: dict[str, int]
    # island -> tenant -> pass
    passes: dict[str, dict[int, float]]
    dispatched: int
    completed: int


class GangScheduler:
    """Orders work per island; ``window`` launches in flight per window key."""

    DEFAULT_COST = 1e-3  # seconds, before a program has been measured

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"the in-flight window must be at least 1; got {window}")
        self.window = window
        self._islands: dict[str, _IslandQueue] = {}
        self._by_key: dict[str, set[str]] = {}
        self._inflight: collections.Counter[str] = collections.Counter()
        self._inflight_lids: dict[int, tuple[str, Work]] = {}
        self._queued: collections.Counter[int] = collections.Counter()
        self._weight: dict[int, float] = {}
        self._cost: dict[str, float] = {}
        self._ready: set[str] = set()
        self._arrivals = itertools.count()
        self._dispatched = 0
        self._completed = 0

    # configuration ------------------------------------------------------------------
    def add_island(self, island: str, window_key: str) -> None:
        q = self._islands.get(island)
        if q is None:
            self._islands[island] = _IslandQueue(window_key)
        else:
            self._by_key.get(q.window_key, set()).discard(island)
            q.window_key = window_key
        self._by_key.setdefault(window_key, set()).add(island)

    def set_weight(self, tenant: int, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"a tenant's weight must be positive; got {weight}")
        self._weight[tenant] = weight

    # events -------------------------------------------------------------------------
    def submit(self, work: Work) -> None:
        q = self._islands.get(work.island)
        if q is None:
            raise KeyError(f"unknown island {work.island!r}")
        tenant = work.tenant
        self._queued[tenant] += 1
        dq = q.queues.get(tenant)
        if dq is None:
            self._join(q, tenant)
            dq = q.queues[tenant] = collections.deque([work])
            q.head_changed(tenant)
            if tenant not in q.in_heap:
                q.in_heap.add(tenant)
                heapq.heappush(q.heap, (q.passes[tenant], next(self._arrivals), tenant))
        else:
            dq.append(work)
        self._ready.add(work.island)

    def _join(self, q: _IslandQueue, tenant: int) -> None:
        """The tenant has work queued on ``q``'s island again: set where its pass starts.

        It starts level with the tenants queued there now: idle time earns no credit, so
        it cannot starve them. Within one competition it keeps what it owes (a tenant
        submitting one launch at a time still waits its turn behind its last one); once
        every queue here has emptied a new one begins, level for all: what a tenant ran
        while no other waited took nothing from anyone, and would otherwise give every
        slot to the tenants that were idle meanwhile when all come back at once. Passes
        only grow (see the top): levelling raises the others to the largest.
        """
        top = self._pick(q)
        busy = None if top is None else q.passes[top]
        if busy is None:
            q.competition += 1
            q.level = q.max_pass
        mine = q.passes.get(tenant, 0.0)
        if q.joined.get(tenant) != q.competition:
            mine = max(mine, q.level)
            q.joined[tenant] = q.competition
        q.passes[tenant] = mine if busy is None else max(mine, busy)

    def complete(self, lid: int, seconds: float | None = None) -> Work | None:
        """A launch finished; ``seconds`` is its measured device time."""
        entry = self._inflight_lids.pop(lid, None)
        if entry is None:
            return None
        key, work = entry
        self._inflight[key] -= 1
        self._completed += 1
        if seconds is not None and work.cost_key:
            old = self._cost.get(work.cost_key)
            self._cost[work.cost_key] = seconds if old is None else 0.8 * old + 0.2 * seconds
        self._wake(key)
        return work

    def release(self, lid: int) -> None:
        """A launch stays pending but gives back its window slot (its host parked it)."""
        entry = self._inflight_lids.pop(lid, None)
        if entry is not None:
            self._inflight[entry[0]] -= 1
            self._wake(entry[0])

    def _wake(self, key: str) -> None:
        for island in self._by_key.get(key, ()):
            q = self._islands.get(island)
            if q is not None and not q.empty():
                self._ready.add(island)

    def cancel(self, tenant: int) -> list[Work]:
        """Drop the tenant's queued work (not what is in flight). Returns what was dropped."""
        dropped: list[Work] = []
        for island, q in self._islands.items():
            dq = q.queues.pop(tenant, None)
            if dq:
                dropped.extend(w for w in dq if w.kind == "run")
                # Deletions still go out (the arrays exist on the host and must be freed),
                # and so do transfers: they finish on their own.
                keep = collections.deque(w for w in dq if w.kind != "run")
                if keep:
                    q.queues[tenant] = keep
                    self._ready.add(island)
                q.head_changed(tenant)
        self._queued[tenant] -= len(dropped)
        return dropped

    def fail_island(self, island: str) -> list[Work]:
        """The island's host is gone: everything queued or in flight there is returned."""
        q = self._islands.pop(island, None)
        out: list[Work] = []
        if q is not None:
            self._by_key.get(q.window_key, set()).discard(island)
            for tenant, dq in q.queues.items():
                self._queued[tenant] -= len(dq)
                out.extend(w for w in dq if w.kind == "run")
        keys = set()
        for lid, (key, work) in list(self._inflight_lids.items()):
            if work.island == island:
                del self._inflight_lids[lid]
                self._inflight[key] -= 1
                keys.add(key)
                out.append(work)
        self._ready.discard(island)
        for key in keys:
            self._wake(key)
        return out

    def dispatch(self) -> list[Work]:
        """Everything that may go to hosts now, in the order it must be sent."""
        out: list[Work] = []
        while self._ready:
            island = self._ready.pop()
            q = self._islands.get(island)
            if q is None:
                continue
            while True:
                tenant = self._pick(q)
                if tenant is None:
                    break
                head = q.queues[tenant][0]
                if head.kind == "run" and self._inflight[q.window_key] >= self.window:
                    # The window is full. Deletions and transfers need no slot: send
                    # every tenant's that stand at the head of its queue (order within
                    # a tenant is kept, so one behind a blocked run waits with it).
                    out.extend(self._heads_needing_no_slot(q))
                    break
                self._pop(q, tenant)
                if head.kind == "run":
                    self._inflight[q.window_key] += 1
                    self._inflight_lids[head.lid] = (q.window_key, head)
                    cost = self._cost.get(head.cost_key, self.DEFAULT_COST)
                    after = q.passes[tenant] + cost / self._weight.get(tenant, 1.0)
                    q.passes[tenant] = after
                    if after > q.max_pass:
                        q.max_pass = after
                    self._dispatched += 1
                out.append(head)
        return out

    def _pop(self, q: _IslandQueue, tenant: int) -> Work:
        dq = q.queues[tenant]
        work = dq.popleft()
        if not dq:
            del q.queues[tenant]
        q.head_changed(tenant)
        self._queued[tenant] -= 1
        return work

    def _heads_needing_no_slot(self, q: _IslandQueue) -> list[Work]:
        out = []
        for tenant in sorted(q.free_heads):
            while tenant in q.free_heads:
                out.append(self._pop(q, tenant))
        return out

    def _pick(self, q: _IslandQueue) -> int | None:
        """The tenant with queued work here whose pass is smallest."""
        h = q.heap
        while h:
            p, arrival, tenant = h[0]
            if not q.queues.get(tenant):
                heapq.heappop(h)
                q.in_heap.discard(tenant)
                continue
            current = q.passes[tenant]
            if p != current:
                heapq.heapreplace(h, (current, arrival, tenant))
                continue
            return tenant
        return None

    def forget_tenant(self, tenant: int) -> None:
        """The tenant left; its queues were already cancelled."""
        if not self._queued[tenant]:
            self._weight.pop(tenant, None)
            for q in self._islands.values():
                q.passes.pop(tenant, None)
                q.joined.pop(tenant, None)
            del self._queued[tenant]

    def inflight_lids(self) -> Iterable[int]:
        return self._inflight_lids.keys()

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            queued={i: sum(len(d) for d in q.queues.values()) for i, q in self._islands.items()},
            inflight={k: v for k, v in self._inflight.items() if v},
            passes={i: dict(q.passes) for i, q in self._islands.items()},
            dispatched=self._dispatched,
            completed=self._completed,
        )
