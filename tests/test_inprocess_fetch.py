"""Fetches and waits of many arrays: one request per host, the values as put, errors by name."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import zmq
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.wire import decode, encode


def test_a_pytree_across_two_hosts_comes_back_whole_in_one_request_per_host(
    client: pw.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = client.allocate({"x": 2}), client.allocate({"x": 2})
    assert a.host != b.host
    rng = np.random.default_rng(0)
    small = [rng.standard_normal(3).astype(np.float32) for _ in range(1100)]
    odd = {
        "empty": np.zeros((0, 4), np.float32),
        "ints": np.arange(12, dtype=np.int32).reshape(6, 2),
        "half": rng.standard_normal((4, 2)).astype(np.float16),
        "flags": np.array([True, False, True, True]),
        "scalar": np.array(2.5, np.float32),
    }
    key = jax.random.key(7)
    tree = {
        "small": [(a if i % 2 else b).put(v) for i, v in enumerate(small)],
        "odd": {
            k: a.put(v, P("x") if v.ndim and v.shape[0] % 2 == 0 else P()) for k, v in odd.items()
        },
        "key": b.put(key),
        "plain": 3,
    }
    sent: list[dict[str, Any]] = []
    real = client._direct.request

    def spy(requests: Any, check: Any) -> Any:
        sent.extend(h for _, h in requests)
        return real(requests, check)

    monkeypatch.setattr(client._direct, "request", spy)
    got = pw.fetch(tree)
    for v, g in zip(small, got["small"], strict=True):
        np.testing.assert_array_equal(g, v)
    for k, v in odd.items():
        assert got["odd"][k].dtype == v.dtype and got["odd"][k].shape == v.shape
        np.testing.assert_array_equal(got["odd"][k], v)
    assert jax.dtypes.issubdtype(got["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(got["key"]), jax.random.key_data(key))
    assert got["plain"] == 3
    # 1,106 arrays in requests of at most 512 per host: 555 on a, 551 on b.
    assert sorted(len(h.get("handles", [h.get("handle")])) for h in sent) == [39, 43, 512, 512]
    assert {h["t"] for h in sent} == {"fetch_many"}

    sent.clear()
    assert pw.block_until_ready(tree) is tree
    assert sorted(h["t"] for h in sent) == ["wait_many"] * 4
    assert all(x.is_ready() for x in tree["small"])


def test_a_failed_array_among_many_raises_its_own_error_and_marks_only_it(
    client: pw.Client,
) -> None:
    vs = client.allocate({"data": 2})
    client.inject_fault(vs, match="broken_one")
    x = vs.put(np.ones(4, np.float32), P("data"))
    good = [pw.jit(lambda v, i=i: v + i, name=f"fine_{i}")(x) for i in range(5)]
    bad = pw.jit(lambda v: v * 2, name="broken_one")(x)
    with pytest.raises(pw.RemoteError) as info:
        pw.fetch([*good[:3], bad, *good[3:]])
    assert info.value.program == "broken_one" and info.value.kind == "fault_injected"
    assert "failed" in repr(bad) and "failed" not in repr(good[0])
    with pytest.raises(pw.RemoteError, match="injected fault"):
        pw.block_until_ready({"good": good[0], "bad": bad})
    # The others are still there, and so is the host.
    for i, v in enumerate(pw.fetch(good)):
        np.testing.assert_array_equal(v, np.full(4, 1.0 + i, np.float32))


def test_bad_many_requests_get_an_error_and_the_host_keeps_serving(
    cluster: pw.InProcessCluster, client: pw.Client
) -> None:
    vs = client.allocate({"x": 2})
    xs = [vs.put(np.full(2, i, np.float32)) for i in range(3)]
    ctx = cluster.context
    sock = ctx.socket(zmq.DEALER)
    sock.connect(vs.data_address)
    try:
        sock.send_multipart(encode({**client._direct.hello, "rid": 1}))  # as the client
        assert sock.poll(10_000)
        assert decode(sock.recv_multipart()).header["t"] == "welcome"
        for rid, handles in (
            (2, []),
            (3, ["not", "handles"]),
            (4, [xs[0].handle] * 513),
            (5, [xs[0].handle, 1.5]),
        ):
            sock.send_multipart(encode({"t": "fetch_many", "rid": rid, "handles": handles}))
            assert sock.poll(10_000)
            h = decode(sock.recv_multipart()).header
            assert h["t"] == "error" and h["rid"] == rid
            assert "1 to 512 integer handles" in h["message"]
        sock.send_multipart(encode({"t": "wait_many", "rid": 6, "handles": "nope"}))
        assert sock.poll(10_000)
        h = decode(sock.recv_multipart()).header
        assert h["t"] == "error" and "handles" in h["message"]
    finally:
        sock.close(0)
    for i, v in enumerate(pw.fetch(xs)):
        np.testing.assert_array_equal(v, np.full(2, i, np.float32))
