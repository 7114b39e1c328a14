"""Shared fixtures. Eight simulated CPU devices, set before JAX is imported anywhere."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


@pytest.fixture(scope="session")
def cluster() -> Iterator[pw.InProcessCluster]:
    """Controller and two hosts of four devices each, in this process over inproc://."""
    c = pw.InProcessCluster(islands=2, devices_per_island=4)
    yield c
    c.close()


@pytest.fixture
def client(cluster: pw.InProcessCluster) -> Iterator[pw.Client]:
    c = cluster.client()
    yield c
    c.close()


@pytest.fixture
def ran(client: pw.Client) -> pw.Client:
    """Programs on two slices joined by a transfer, finished."""
    a = client.allocate({"x": 2}, name="enc")
    b = client.allocate({"x": 2}, name="dec")
    enc = pw.jit(lambda v: jnp.tanh(v) * 2.0, slice=a, name="encode")
    dec = pw.jit(lambda v: v.sum(), slice=b, name="decode")
    x = a.put(np.ones((4, 4), np.float32), P("x"))
    for _ in range(3):
        float(dec(enc(x)))
    client.wait_all()
    return client
