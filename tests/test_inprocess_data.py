"""Dask arrays feeding slices: computed on the Dask worker that runs the slice's host.

An in-process Dask cluster (threads) whose workers are named as the in-process hosts
and carry them as the worker preload does, so the whole path runs in this process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import dask
import dask.array as da
import dask.bag as db
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from distributed import Client as DaskClient
from distributed import Scheduler, SpecCluster, Worker, get_worker
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config
from pathways_nb.deploy.worker import _HOST_ATTR

# Launches wait this long for a put's bytes; Dask puts wait as long as Dask computes.
PUT_WAIT = 0.5
# Given as map_blocks' meta, so that Dask does not call the function to infer it.
_F32 = np.empty((0,), np.float32)


@contextlib.contextmanager
def _fed_cluster(
    islands: int, tenant_store_bytes: int = 0
) -> Iterator[tuple[pw.InProcessCluster, DaskClient]]:
    cluster = pw.InProcessCluster(
        islands=islands,
        devices_per_island=2,
        config=Config(put_wait_seconds=PUT_WAIT, tenant_store_bytes=tenant_store_bytes),
    )
    spec = {
        h.name: {"cls": Worker, "options": {"nthreads": 2, "name": h.name}} for h in cluster.hosts
    }
    dask_cluster = SpecCluster(
        workers=spec,
        scheduler={"cls": Scheduler, "options": {"dashboard": False, "dashboard_address": ":0"}},
        asynchronous=False,
    )
    for host in cluster.hosts:
        setattr(dask_cluster.workers[host.name], _HOST_ATTR, host)
    dc = DaskClient(dask_cluster, set_as_default=False)
    try:
        yield cluster, dc
    finally:
        dc.close()
        dask_cluster.close()
        cluster.close()


@pytest.fixture(scope="module")
def fed() -> Iterator[tuple[pw.InProcessCluster, DaskClient]]:
    with _fed_cluster(islands=2) as pair:
        yield pair


@pytest.fixture
def client(fed: tuple[pw.InProcessCluster, DaskClient]) -> Iterator[pw.Client]:
    cluster, dc = fed
    c = cluster.client(dask_client=dc)
    yield c
    c.close()


def _island_of_worker(block: np.ndarray) -> np.ndarray:
    # Each value says which worker computed it: host0's worker writes 0, host1's 1.
    return np.full(block.shape, int(get_worker().name[-1]), block.dtype)


def test_a_dask_array_is_computed_on_its_hosts_worker_and_equals_numpy(
    client: pw.Client,
) -> None:
    for vs in (client.allocate({"data": 2}), client.allocate({"data": 2})):
        x = da.arange(32 * 6, dtype=np.float32, chunks=24).reshape(32, 6)
        r = vs.put(x, P("data"))
        assert (r.shape, r.dtype) == ((32, 6), np.float32)
        assert r.sharding.spec == P("data")
        np.testing.assert_array_equal(np.asarray(r), x.compute())
        zeros = da.zeros((8, 2), np.int32, chunks=2)
        where = vs.put(zeros.map_blocks(_island_of_worker, dtype=np.int32), P())
        island = int(vs.island[-1])
        assert vs.host == f"host{island}"
        np.testing.assert_array_equal(np.asarray(where), np.full((8, 2), island))
        # A pytree of Dask arrays, and one with a 64-bit dtype stored as JAX stores it.
        tree = vs.put({"a": x, "b": da.ones(4, dtype=np.float64, chunks=2)}, P())
        assert tree["b"].dtype == np.float32
        np.testing.assert_array_equal(tree["b"].fetch(), np.ones(4, np.float32))


def test_programs_wait_for_a_dask_put_longer_than_a_put_waits_for_its_bytes(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 2})
    slow = da.ones((8, 4), np.float32, chunks=4).map_blocks(
        lambda b: (time.sleep(4 * PUT_WAIT), b)[1], meta=_F32
    )
    t0 = time.monotonic()
    r = vs.put(slow, P("data"))
    assert time.monotonic() - t0 < PUT_WAIT  # returns at once, as any put does
    assert not r.is_ready()
    total = pw.jit(lambda a: (a * 3).sum())(r)
    assert float(total) == 96.0
    assert time.monotonic() - t0 > 4 * PUT_WAIT
    assert r.is_ready()
    client.wait_all(10)  # Dask tells of the task's end on a thread of its own


def _boom(block: np.ndarray) -> np.ndarray:
    raise ValueError("a corrupt shard")


def test_a_failing_dask_graph_fails_the_array_and_everything_computed_from_it(
    client: pw.Client, fed: tuple[pw.InProcessCluster, DaskClient]
) -> None:
    vs = client.allocate({"data": 2})
    bad = vs.put(
        da.ones((8, 4), np.float32, chunks=4).map_blocks(_boom, dtype=np.float32), P("data")
    )
    derived = pw.jit(lambda a: a + 1)(bad)
    for x in (bad, derived):
        with pytest.raises(pw.RemoteError, match="a corrupt shard") as info:
            x.fetch()
        assert info.value.kind == "dask"
        assert "_boom" in info.value.remote_traceback
    with pytest.raises(pw.RemoteError, match="a corrupt shard"):
        bad.block_until_ready()
    # The host, the controller and the Dask workers go on serving.
    good = vs.put(da.full((4,), 2.0, dtype=np.float32, chunks=2), P("data"))
    np.testing.assert_array_equal(good.fetch(), np.full(4, 2.0, np.float32))
    assert fed[0].controller.statistics().live_hosts == 2


_STARTED = threading.Event()


def _slow_start(block: np.ndarray) -> np.ndarray:
    _STARTED.set()
    time.sleep(0.3)
    return block


def test_a_dask_put_deleted_before_it_lands_is_not_kept_on_the_host(
    client: pw.Client, fed: tuple[pw.InProcessCluster, DaskClient]
) -> None:
    vs = client.allocate({"data": 2})
    host = next(h for h in fed[0].hosts if h.name == vs.host)
    before = host.store.statistics().arrays
    _STARTED.clear()
    ones = da.ones((1024, 256), np.float32, chunks=512)
    r = vs.put(ones.map_blocks(_slow_start, meta=_F32), P("data"))
    assert _STARTED.wait(10)
    r.delete()
    client.wait_all(10)
    deadline = time.monotonic() + 10
    while host.store.statistics().arrays != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.store.statistics().arrays == before
    assert len(host.executor.fed) == 0


_RELEASE = threading.Event()


def _sleeps(block: np.ndarray) -> np.ndarray:
    _RELEASE.wait(30)
    return block


def test_a_dask_put_for_a_host_that_is_lost_fails_as_data_loss_at_once() -> None:
    with _fed_cluster(islands=1) as (cluster, dc), cluster.client(dask_client=dc) as client:
        vs = client.allocate({"data": 2})
        r = vs.put(da.ones((4,), np.float32, chunks=2).map_blocks(_sleeps, meta=_F32), P("data"))
        t0 = time.monotonic()
        cluster.controller.host_lost(vs.host, "killed by the test")
        client.wait_all(10)  # the Dask task is cancelled: it would wait for that worker
        assert time.monotonic() - t0 < 10
        with pytest.raises(pw.DataLossError, match="lost"):
            r.fetch()
        _RELEASE.set()  # the cancelled task's thread runs on until its function returns


def test_other_dask_collections_and_unknown_shapes_are_refused_with_the_way_out(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 2})
    with pytest.raises(TypeError, match=r"got a Dask Bag.*to_dask_array\(lengths=True\)"):
        vs.put(db.from_sequence([1.0, 2.0]))
    x = da.arange(8, chunks=4)
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        vs.put(x[x > 3])
    with pytest.raises(TypeError, match="numeric or boolean"):
        vs.put(da.from_array(np.array(["a", "b"]), chunks=1))
    with pytest.raises(ValueError, match="does not split evenly"):
        vs.put(da.ones(5, chunks=5), P("data"))
    with pytest.raises(TypeError, match=r"got a Dask Delayed.*from_delayed"):
        vs.put(dask.delayed(np.ones)(3))
    assert client.pending() == 0


def test_a_dask_client_of_another_cluster_is_refused_naming_the_host(
    cluster: pw.InProcessCluster, fed: tuple[pw.InProcessCluster, DaskClient]
) -> None:
    # A slice whose host no worker of that Dask scheduler runs, as when the Dask client
    # is another cluster's (here the names host0 and host1 would match by chance).
    with cluster.client(dask_client=fed[1]) as other:
        vs = other.allocate({"data": 2})
        vs.host = "tcp://10.0.0.9:1234"
        with pytest.raises(ValueError, match=r"no worker of the Dask scheduler.*dask_client="):
            vs.put(da.ones(4, chunks=2), P("data"))
        assert other.pending() == 0


def test_without_a_dask_cluster_a_dask_array_is_computed_by_the_client(
    cluster: pw.InProcessCluster,
) -> None:
    with cluster.client() as plain:
        assert plain.dask_client is None
        vs = plain.allocate({"data": 4})
        x = da.random.default_rng(0).standard_normal((16, 4), chunks=4).astype(np.float32)
        np.testing.assert_array_equal(vs.put(x, P("data")).fetch(), x.compute())
        got = [b.fetch() for b in pw.data.batches(x, vs, batch_size=8)]
        np.testing.assert_array_equal(np.concatenate(got), x.compute())


_COMPUTED: list[int] = []


def _counted(block: np.ndarray, block_info: Any = None) -> np.ndarray:
    _COMPUTED.append(block_info[0]["chunk-location"][0])  # list.append holds the GIL
    return block


def test_batches_are_the_rows_in_order_and_keep_prefetch_batches_ahead(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 2})
    computed = _COMPUTED
    computed.clear()
    xs = np.arange(100 * 3, dtype=np.float32).reshape(100, 3)
    ys = np.arange(100, dtype=np.int32)
    x = da.from_array(xs, chunks=(10, 3)).map_blocks(_counted, dtype=np.float32)
    y = da.from_array(ys, chunks=10)
    it = pw.data.batches({"x": x, "y": y}, vs, batch_size=10, prefetch=2)
    first = next(it)
    # The first batch is on the host; two more were asked for, and no others.
    assert first["x"].is_ready()
    assert sorted(computed) <= [0, 1, 2] and 0 in computed
    rest = list(it)
    assert len(rest) == 9 and sorted(computed) == list(range(10))
    for i, b in enumerate([first, *rest]):
        np.testing.assert_array_equal(b["x"].fetch(), xs[10 * i : 10 * i + 10])
        np.testing.assert_array_equal(b["y"].fetch(), ys[10 * i : 10 * i + 10])
        assert b["x"].sharding.spec == P("data")
    # A last shorter batch comes only when asked for.
    tail = list(pw.data.batches((x, y), vs, batch_size=16, drop_remainder=False, spec=P()))
    assert [b[0].shape[0] for b in tail] == [16] * 6 + [4]
    assert len(list(pw.data.batches((x, y), vs, batch_size=16))) == 6


def test_shuffled_batches_take_the_rows_in_the_seeds_permutation(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    xs = np.arange(60 * 2, dtype=np.float32).reshape(60, 2)
    ys = np.arange(60, dtype=np.int32)
    x, y = da.from_array(xs, chunks=(16, 2)), da.from_array(ys, chunks=16)
    epochs = []
    for seed in (0, 1):
        order = np.random.default_rng(seed).permutation(60)
        got = [
            (bx.fetch(), by.fetch())
            for bx, by in pw.data.batches((x, y), vs, batch_size=8, shuffle=seed)
        ]
        assert len(got) == 7  # 56 of the 60 rows: the last 4 make no whole batch
        for i, (bx, by) in enumerate(got):
            np.testing.assert_array_equal(bx, xs[order[8 * i : 8 * i + 8]])
            np.testing.assert_array_equal(by, ys[order[8 * i : 8 * i + 8]])
        epochs.append(np.concatenate([by for _, by in got]))
    assert not np.array_equal(epochs[0], epochs[1])
    with pytest.raises(TypeError, match="shuffle is a seed"):
        pw.data.batches(x, vs, batch_size=8, shuffle=True)


def test_a_batch_that_fails_raises_where_it_would_be_yielded(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})

    def third_fails(b: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info[0]["chunk-location"][0] == 2:
            raise OSError("shard 2 is unreadable")
        return b

    x = da.ones((40, 2), np.float32, chunks=(8, 2)).map_blocks(third_fails, dtype=np.float32)
    it = pw.data.batches(x, vs, batch_size=8)
    assert [next(it).shape, next(it).shape] == [(8, 2), (8, 2)]
    with pytest.raises(pw.RemoteError, match="shard 2 is unreadable"):
        next(it)


def test_batches_arguments_are_checked_before_anything_is_computed(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    x = da.ones((10, 2), np.float32, chunks=5)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"batch_size": 0}, ValueError, "batch_size is a whole number of 1 or more"),
        ({"batch_size": 4, "prefetch": -1}, ValueError, "prefetch"),
        ({"batch_size": 3}, ValueError, "over 2 devices .* Choose a batch_size that those"),
        ({"batch_size": 11}, ValueError, "fewer than one batch"),
        ({"batch_size": 2, "spec": {"a": P()}}, ValueError, "matching the data's structure"),
    ]
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            pw.data.batches(x, vs, **kwargs)
    with pytest.raises(ValueError, match=r"a batch of shape \(1, 2\) cannot be laid out"):
        pw.data.batches(x[:9], vs, batch_size=4, drop_remainder=False)
    with pytest.raises(ValueError, match=r"the last batch, .* leave it out \(drop_remainder"):
        pw.data.batches(x[:9], vs, batch_size=4, drop_remainder=False)
    # Causes other than the batch's rows keep the slice's own advice, and only it.
    with pytest.raises(ValueError) as info:
        pw.data.batches(x, vs, batch_size=2, spec=P("model"))
    assert str(info.value).endswith(f"names axis 'model', but slice {vs.name!r} has axes ['data']")
    with pytest.raises(ValueError) as info:
        pw.data.batches(x, vs, batch_size=2, spec=P(None, "data", None))
    assert "batch_size" not in str(info.value)
    with pytest.raises(ValueError) as info:
        pw.data.batches(da.ones((10, 3), chunks=5), vs, batch_size=2, spec=P(None, "data"))
    assert str(info.value).endswith("leave this one unsharded (None in its place)")
    with pytest.raises(ValueError, match="same number of rows"):
        pw.data.batches((x, da.ones(4, chunks=2)), vs, batch_size=2)
    with pytest.raises(TypeError, match="from_array"):
        pw.data.batches(np.ones((4, 2)), vs, batch_size=2)
    with pytest.raises(TypeError, match="VirtualSlice"):
        pw.data.batches(x, "s1", batch_size=2)  # type: ignore[arg-type]
    assert client.pending() == 0


def _loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def _step(params: Any, opt: Any, x: jax.Array, y: jax.Array) -> Any:
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    updates, opt = optax.sgd(0.1).update(grads, opt)
    return optax.apply_updates(params, updates), opt, loss


def test_training_on_batches_matches_plain_jax_on_the_same_rows(client: pw.Client) -> None:
    vs = client.allocate({"data": 2})
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((96, 8)).astype(np.float32)
    ys = rng.standard_normal((96, 2)).astype(np.float32)
    init = {
        "w1": (rng.standard_normal((8, 16)) / 3).astype(np.float32),
        "w2": (rng.standard_normal((16, 2)) / 4).astype(np.float32),
    }
    x, y = da.from_array(xs, chunks=(32, 8)), da.from_array(ys, chunks=(32, 2))

    params = vs.put(init, P())
    opt = pw.jit(optax.sgd(0.1).init, slice=vs)(params)
    step = pw.jit(_step, donate_argnums=(0, 1))
    losses = []
    for _ in range(2):  # two epochs
        for bx, by in pw.data.batches((x, y), vs, batch_size=24, prefetch=3):
            params, opt, loss = step(params, opt, bx, by)
            losses.append(loss)
    got = [float(v) for v in pw.fetch(losses)]

    ref_params: Any = jax.tree.map(jnp.asarray, init)
    ref_opt = optax.sgd(0.1).init(ref_params)
    ref_step = jax.jit(_step)
    want = []
    for _ in range(2):
        for i in range(4):
            sl = slice(24 * i, 24 * i + 24)
            ref_params, ref_opt, loss = ref_step(ref_params, ref_opt, xs[sl], ys[sl])
            want.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[-1] < got[0]


def test_a_dask_put_right_after_a_deletion_waits_for_it_under_a_store_quota() -> None:
    """The deletion goes through the controller, the value from Dask straight into the
    host's store: a value that does not fit waits there for the put's note, which the
    controller passes on after the deletion."""
    kib = 1024
    with _fed_cluster(islands=1, tenant_store_bytes=64 * kib) as (cluster, dc):
        c = cluster.client(dask_client=dc)
        vs = c.allocate({"data": 2})
        for round_ in range(5):
            kept = vs.put(np.ones(12 * kib, np.float32), P("data"))  # 48 KiB of the 64
            kept.block_until_ready()
            kept.delete()
            value = da.full((8 * kib,), float(round_), dtype=np.float32, chunks=4 * kib)
            again = vs.put(value, P("data"))  # 32 KiB: fits once the 48 are gone
            np.testing.assert_array_equal(again.fetch(), np.full(8 * kib, round_, np.float32))
            del again
        # The deletion waits on the host behind a launch that holds its queue; the value
        # comes meanwhile and waits for its note, which comes after the deletion.
        kept = vs.put(np.ones(12 * kib, np.float32), P("data"))
        kept.block_until_ready()
        c.inject_fault(vs, "slow", "delay:0.5")
        slow = pw.jit(lambda v: v + 1, name="slow")(vs.put(np.ones(2, np.float32), P()))
        kept.delete()
        again = vs.put(da.full((8 * kib,), 7.0, dtype=np.float32, chunks=4 * kib), P("data"))
        np.testing.assert_array_equal(again.fetch(), np.full(8 * kib, 7.0, np.float32))
        np.testing.assert_array_equal(slow.fetch(), np.full(2, 2.0, np.float32))
        del again
        # Past the quota with nothing to delete, it still fails, once its note is in.
        kept = vs.put(np.ones(12 * kib, np.float32), P("data"))
        over = vs.put(da.ones((8 * kib,), dtype=np.float32, chunks=4 * kib), P("data"))
        with pytest.raises(pw.ResourceExhaustedError, match="one client may keep on a host"):
            over.fetch()
        c.close()
