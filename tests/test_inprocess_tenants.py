"""Tenants sharing an island: the gang scheduler shares its device time by weight."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw

BACKLOG = 320


@pytest.fixture(scope="module")
def island() -> Iterator[pw.InProcessCluster]:
    """One island of four devices, so two 2-device slices share its gang scheduler."""
    c = pw.InProcessCluster(islands=1, devices_per_island=4)
    yield c
    c.close()


@pw.jit
def work(m: jax.Array) -> jax.Array:
    for _ in range(4):
        m = jnp.tanh(m @ m)
    return m


def _backlog(m: pw.RemoteArray) -> pw.RemoteArray:
    """Submit BACKLOG dependent launches at once: they queue far faster than they run,
    and the island's window keeps XLA's own queue short."""
    for _ in range(BACKLOG):
        m = work(m)
    return m


def _runs(client: pw.Client, program: str) -> pd.DataFrame:
    """One row per launch of ``program``: tenant, start and end."""
    client.wait_all()
    ev = client.events(all_tenants=True)
    ev = ev[ev.kind.isin(["start", "end"]) & (ev.program == program)]
    runs = ev.pivot_table(index="lid", columns="kind", values="time", aggfunc="first").dropna()
    runs["tenant"] = ev.groupby("lid").tenant.first()
    return runs


def test_backlogged_tenants_share_the_island_by_weight(island: pw.InProcessCluster) -> None:
    light = island.client(name="light", weight=1.0)
    heavy = island.client(name="heavy", weight=3.0)
    try:
        va, vb = light.allocate({"x": 2}), heavy.allocate({"x": 2})
        assert va.island == vb.island
        eye = np.eye(256, dtype=np.float32)
        ma, mb = va.put(eye, P("x")), vb.put(eye, P("x"))
        work(ma).block_until_ready()
        work(mb).block_until_ready()
        since = pd.Timestamp.now()
        for m in (ma, mb):
            _backlog(m)
        runs = _runs(light, "work")
        runs = runs[runs.start >= since]
        # While both are backlogged (from the heavy tenant's first launch to its last),
        # the island's device time goes three to one. The programs are the same, so it
        # shows in the launches each got (their times vary with the two cores' load).
        # The middle of that stretch is counted: at its ends, launches already in the
        # window when the other tenant arrived, or left when it ran out, still run.
        mine = runs[runs.tenant == heavy.tenant]
        t0, t1 = mine.start.min(), mine.end.max()
        edge = (t1 - t0) * 0.1
        both = runs[(runs.start >= t0 + edge) & (runs.end <= t1 - edge)]
        assert 2.5 <= _ratio(both, heavy, light) <= 3.5
    finally:
        light.close()
        heavy.close()


def test_a_tenant_backlog_does_not_delay_another_tenants_call(
    island: pw.InProcessCluster,
) -> None:
    busy = island.client(name="busy")
    quick = island.client(name="quick")
    try:
        va, vb = busy.allocate({"x": 2}), quick.allocate({"x": 2})
        ma = va.put(np.eye(256, dtype=np.float32), P("x"))
        small = vb.put(np.arange(4, dtype=np.float32), P("x"))
        work(ma).block_until_ready()
        (small * 2 + 1).block_until_ready()  # compiled before the race
        last = _backlog(ma)
        got = np.asarray(small * 2 + 1)
        np.testing.assert_array_equal(got, np.arange(4) * 2 + 1)
        last.block_until_ready()
        # The quick call ran while most of the backlog was still to run: the scheduler
        # let it in at the next free place in the window, not behind all that was queued.
        runs = _runs(busy, "work")
        ev = quick.events()
        quick_end = ev[ev.kind == "end"].time.max()
        after = (runs[runs.tenant == busy.tenant].end > quick_end).sum()
        assert after >= BACKLOG // 2, after
    finally:
        busy.close()
        quick.close()


def test_a_tenant_on_two_islands_keeps_its_share_of_the_one_it_shares() -> None:
    """What a tenant runs on another island (another stage of its pipeline) does not
    cost it its share of the island it contends for."""
    with pw.InProcessCluster(islands=2, devices_per_island=2) as cluster:
        both = cluster.client(name="both")
        one = cluster.client(name="one")
        try:
            mine = both.allocate({"x": 1})
            other = both.allocate({"x": 1})
            theirs = one.allocate({"x": 1})
            assert mine.island != other.island  # so one of them shares theirs
            eye = np.eye(256, dtype=np.float32)
            arrays = [vs.put(eye, P("x")) for vs in (mine, other, theirs)]
            for m in arrays:
                work(m).block_until_ready()
            since = pd.Timestamp.now()
            # The three chains submitted a launch each in turn: on the shared island the
            # two tenants' queues grow alike however fast the submitting goes.
            for _ in range(BACKLOG):
                arrays = [work(m) for m in arrays]
            runs = _runs(both, "work")
            runs = runs[
                (runs.start >= since) & (runs.index.map(_island_of(both, one)) == theirs.island)
            ]
            # While both tenants are backlogged on the shared island (from the later
            # one's first launch there to the earlier one's last), launches go one to
            # one, as their weights. The middle of that stretch is counted, as above.
            t0 = runs.groupby("tenant").start.min().max()
            t1 = runs.groupby("tenant").end.max().min()
            edge = (t1 - t0) * 0.1
            shared = runs[(runs.start >= t0 + edge) & (runs.end <= t1 - edge)]
            assert 0.7 <= _ratio(shared, both, one) <= 1.4
        finally:
            both.close()
            one.close()


def _ratio(runs: pd.DataFrame, a: pw.Client, b: pw.Client) -> float:
    """Launches of ``a`` over those of ``b`` among ``runs`` (printed when a check fails)."""
    counts = runs.tenant.value_counts()
    print(counts)
    return float(counts[a.tenant] / counts[b.tenant])


def _island_of(*clients: pw.Client) -> Any:
    """lid -> island of the launch, from the clients' event logs."""
    where: dict[int, str] = {}
    for c in clients:
        ev = c.events()
        where |= dict(zip(ev.lid, ev.island, strict=True))
    return lambda lid: where.get(lid, "")
