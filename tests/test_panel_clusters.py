"""Clusters JupyterLab's panel starts and stops (real processes): each a ``pathways-nb
cluster`` of the Jupyter server's, that ends with it however it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest
from _processes import gone, tree
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.lab import _launched as launched_module
from pathways_nb.lab._launched import Launched, check_platform, check_size, check_tls

pytestmark = pytest.mark.slow


def test_a_started_cluster_serves_notebooks_and_stops() -> None:
    launched = Launched()
    try:
        started = launched.start(2, 2)
        address = started["address"]
        assert started["islands"] == 2 and started["devices_per_island"] == 2
        assert started["platform"] == "cpu"
        assert [c["address"] for c in launched.running()] == [address]
        pids = tree(started["pid"])
        assert len(pids) >= 7  # the command, the scheduler, and a nanny and worker per island
        with pw.Client(address) as client:
            assert len(client.status().islands) == 2
            vs = client.allocate({"x": 2})
            x = np.arange(8, dtype=np.float32)
            y = pw.jit(lambda v: v * 2.0)(vs.put(x, P("x")))
            np.testing.assert_array_equal(y.fetch(), x * 2.0)
        assert launched.stop(address)
        assert gone(pids, 40), f"still running: {pids}"
        assert launched.running() == []
        assert not launched.stop(address)  # stopped already: nothing of ours there
        assert not launched.stop("tcp://127.0.0.1:1")
    finally:
        launched.close()


def test_a_cluster_started_with_tls_is_shown_and_its_connect_cell_connects() -> None:
    pytest.importorskip("cryptography")
    from pathways_nb.lab._boards import Boards

    launched, boards = Launched(), Boards()
    try:
        started = launched.start(1, 2, tls=True)
        address = started["address"]
        assert address.startswith("tls://") and started["tls"] is True
        with pytest.raises(ValueError, match=r"certificate was given"):
            pw.Client(address)  # the panel's server holds the certificate, not Dask's config
        snap = boards.board(address).snapshot()
        assert "error" not in snap, snap.get("error")
        assert "security=security" in snap["connect"] and "tls_client_key=" in snap["connect"]
        cell: dict[str, object] = {}
        exec(snap["connect"], cell)  # what "Insert pw.Client" puts in a notebook
        client = cell["client"]
        assert isinstance(client, pw.Client) and client.controller_address.startswith("tls://")
        vs = client.allocate({"x": 2})
        np.testing.assert_array_equal((vs.put(np.ones(2, np.float32)) + 1).fetch(), [2.0, 2.0])
        client.close()
    finally:
        boards.close()
        launched.close()


def test_a_server_starts_at_most_a_few_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launched_module, "MAX_STARTED", 1)
    launched = Launched()
    try:
        first = launched.start(1, 1)["address"]
        with pytest.raises(ValueError, match=rf"runs 1 clusters it started already.*{first}"):
            launched.start(1, 1)
        assert launched.stop(first)
        second = launched.start(1, 1)["address"]  # room again
        assert [c["address"] for c in launched.running()] == [second]
    finally:
        launched.close()


def test_a_cluster_that_does_not_come_up_in_time_is_stopped() -> None:
    launched = Launched()
    with pytest.raises(RuntimeError, match=r"did not come up within 0 s; stopped it"):
        launched.start(1, 1, timeout=0.01)
    assert launched.running() == []


def test_sizes_the_panel_cannot_start_are_refused() -> None:
    assert check_size(2, 4) == (2, 4)
    assert check_tls(True) and not check_tls(False)
    with pytest.raises(ValueError, match=r"tls is true .* or false; got 'yes'"):
        check_tls("yes")
    assert [check_platform(p) for p in ("cpu", "auto")] == ["cpu", "auto"]
    for bad in ("gpu", None, 1):
        with pytest.raises(ValueError, match=r"platform is 'cpu' .* or 'auto' .*; got"):
            check_platform(bad)
    for islands, devices, word in [
        (0, 4, "islands"),
        (2, 0, "devices_per_island"),
        ("2", 4, "islands"),
        (2, True, "devices_per_island"),
        (2, 4.0, "devices_per_island"),
        (17, 1, "islands"),
        (1, 65, "devices_per_island"),
    ]:
        with pytest.raises(ValueError, match=rf"{word} is a whole number from 1 to \d+; got"):
            check_size(islands, devices)


def test_a_killed_server_leaves_no_cluster_behind() -> None:
    server = textwrap.dedent(
        """
        import json, time
        from pathways_nb.lab._launched import Launched
        print(json.dumps(Launched().start(1, 1)), flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        pids = tree(started["pid"])
        assert len(pids) >= 4
        command = psutil.Process(started["pid"]).cmdline()
        folder = os.path.dirname(command[command.index("--scheduler-file") + 1])
        assert os.path.exists(os.path.join(folder, "cluster.log"))
        proc.kill()
        proc.wait()
        assert gone(pids, 40), f"orphans: {pids}"
        assert not os.path.exists(folder)  # nor its log's folder
    finally:
        if proc.poll() is None:
            proc.kill()
