"""Shared fixtures. Eight simulated CPU devices, set before JAX is imported anywhere."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator

import pytest

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
