"""Quotas per client: the devices its slices hold, and the bytes its arrays take on a
host. A client past its quota hears so in a clear error; the others' work goes on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config

KIB = 1024
QUOTA = 64 * KIB


def _floats(nbytes: int, value: float = 1.0) -> np.ndarray:
    return np.full(nbytes // 4, value, np.float32)


def _until(what: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for state a heartbeat (once a second) brings."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("the state never came")
        time.sleep(0.05)


@pytest.fixture
def quotas() -> Iterator[pw.InProcessCluster]:
    with pw.InProcessCluster(
        1, 4, config=Config(tenant_max_devices=4, tenant_store_bytes=QUOTA)
    ) as c:
        yield c


def test_a_client_holds_at_most_its_device_quota(quotas: pw.InProcessCluster) -> None:
    a, b = quotas.client(name="a"), quotas.client(name="b")
    first = a.allocate({"x": 2}, name="first")
    with pytest.raises(pw.ResourceExhaustedError) as info:
        a.allocate({"x": 3})
    assert "mesh {'x': 3} needs 3 devices, and this client holds 2 (first (2))" in str(info.value)
    assert "of the 4 devices one client may hold" in str(info.value)
    second = a.allocate({"x": 2}, name="second")
    with pytest.raises(pw.ResourceExhaustedError, match="holds 4"):
        a.allocate({"x": 1})
    # The island is full now: another client hears that, not a quota.
    with pytest.raises(pw.BusyError, match="no island has 1 free devices"):
        b.allocate({"x": 1})
    s = a.status()
    assert s.quotas == {"max_devices": 4, "store_bytes": QUOTA}
    held = dict(zip(s.tenants.name, s.tenants.devices, strict=True))
    assert held == {"a": 4, "b": 0}
    line = "quotas per client: 4 devices, 65536 bytes of arrays per host"
    assert s.quota_line == line and line in repr(s)
    from pathways_nb.viz import StatusWidget

    assert line in StatusWidget(a, live=False).html
    second.release()
    assert b.allocate({"x": 2}).size == 2
    x = first.put(np.arange(4.0, dtype=np.float32), P("x"))
    np.testing.assert_array_equal((x * 2).fetch(), np.arange(4.0) * 2)


def test_a_client_past_its_store_quota_fails_alone(quotas: pw.InProcessCluster) -> None:
    a, b = quotas.client(name="a"), quotas.client(name="b")
    va, vb = a.allocate({"x": 2}), b.allocate({"x": 2})
    assert va.host == vb.host
    kept = va.put(_floats(48 * KIB), P("x"))
    kept.block_until_ready()
    # A put past the quota fails as a value; so does a program whose outputs would be.
    over = va.put(_floats(32 * KIB), P("x"))
    with pytest.raises(pw.ResourceExhaustedError, match="one client may keep on a host") as info:
        over.fetch()
    assert info.value.host == va.host
    grow = pw.jit(lambda v: jnp.concatenate([v, v]), name="grow")
    with pytest.raises(pw.ResourceExhaustedError, match="would take 147456 bytes"):
        grow(kept).fetch()
    # The other client on the same host has a quota of its own.
    theirs = vb.put(_floats(24 * KIB, 2.0), P("x"))
    np.testing.assert_array_equal((theirs + 1).fetch(), _floats(24 * KIB, 3.0))
    # Within the quota the first client's work goes on, and deleting makes room.
    np.testing.assert_array_equal(pw.jit(jnp.sum)(kept).fetch(), np.float32(12 * KIB))
    _until(lambda: _bytes(a).get("a") == 48 * KIB)
    # A put right after a deletion fits: it reaches the host before the deletion, which
    # goes through the controller, and waits there for it.
    kept.delete()
    again = va.put(_floats(32 * KIB, 5.0), P("x"))
    np.testing.assert_array_equal(again.fetch(), _floats(32 * KIB, 5.0))
    _until(lambda: _bytes(a).get("a") == 32 * KIB)


def _bytes(client: pw.Client) -> dict[str, int]:
    """Bytes of each client's arrays on the hosts, by client name."""
    t = client.status().tenants
    return dict(zip(t.name, t.store_bytes, strict=True))


def test_a_transfer_past_the_quota_fails_the_program_that_needs_it() -> None:
    config = Config(tenant_store_bytes=QUOTA)
    with pw.InProcessCluster(2, 2, config=config) as c:
        a = c.client()
        here, there = a.allocate({"x": 2}), a.allocate({"x": 2})
        assert here.host != there.host
        full = here.put(_floats(48 * KIB), P("x"))
        far = there.put(_floats(32 * KIB, 3.0), P("x"))
        add = pw.jit(lambda u, v: u[: v.shape[0]] + v, slice=here, name="add")
        with pytest.raises(pw.ResourceExhaustedError, match="one client may keep") as info:
            add(full, far).fetch()
        assert info.value.host == here.host
        # Smaller arrays still move, and the array that stayed is whole.
        small = there.put(_floats(8 * KIB, 3.0), P("x"))
        np.testing.assert_array_equal(add(full, small).fetch(), _floats(8 * KIB, 4.0))
        np.testing.assert_array_equal(far.fetch(), _floats(32 * KIB, 3.0))


def test_a_launch_right_after_a_small_deletion_fits_a_store_quota(
    quotas: pw.InProcessCluster,
) -> None:
    """A deletion under 1 MiB leaves on the client's next IO turn, or with the next put;
    under a quota it leaves ahead of the next launch too, which may need its room."""
    client = quotas.client(name="a")
    vs = client.allocate({"x": 2})
    double = pw.jit(lambda v: v * 2, name="double")
    src = vs.put(_floats(16 * KIB, 3.0), P("x"))
    for _ in range(10):
        kept = vs.put(_floats(40 * KIB), P("x"))  # with src, 56 of the 64 KiB
        kept.block_until_ready()
        del kept
        out = double(src)  # 16 KiB more: fits once kept is gone
        np.testing.assert_array_equal(out.fetch(), _floats(16 * KIB, 6.0))
        del out
    client.close()


def test_status_shows_each_islands_store_limit_and_the_bytes_its_host_keeps() -> None:
    with pw.InProcessCluster(2, 2, config=Config(store_limit_bytes=QUOTA)) as c:
        a, b = c.client(name="a"), c.client(name="b")
        va, vb = a.allocate({"x": 2}), b.allocate({"x": 2})
        kept = [va.put(_floats(16 * KIB), P("x"))]
        kept += [vb.put(_floats(8 * KIB), P("x")) for _ in range(2)]
        for x in kept:
            x.block_until_ready()

        def islands() -> dict[str, tuple[int, int]]:
            t = a.status().islands
            rows = zip(t.host, t.store_bytes, t.store_limit, strict=True)
            return {h: (n, lim) for h, n, lim in rows}

        _until(lambda: islands() == {va.host: (16 * KIB, QUOTA), vb.host: (16 * KIB, QUOTA)})
        assert "store_limit" in repr(a.status())
