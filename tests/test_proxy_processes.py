"""Plain JAX through the IFRT proxy with real processes: ``pathways-nb cluster`` and
``pathways-nb proxy`` started as a user starts them, a training script that calls
``pathwaysutils.initialize()``, and ``%pathways jax`` in an IPython shell."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _processes import gone, tree, wait_for_file

pytestmark = pytest.mark.slow

_PLAIN = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
{setup}
rng = np.random.default_rng(0)
w0 = rng.standard_normal((16, 4)).astype(np.float32)
x = rng.standard_normal((64, 16)).astype(np.float32)
y = rng.standard_normal((64, 4)).astype(np.float32)
mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
data, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

@jax.jit
def step(w, x, y):
    loss, g = jax.value_and_grad(lambda w: ((x @ w - y) ** 2).mean())(w)
    return w - 0.1 * g, loss

w = jax.device_put(w0, rep)
xs, ys = jax.device_put(x, data), jax.device_put(y, data)
losses = []
for _ in range(8):
    w, loss = step(w, xs, ys)
    losses.append(float(loss))
out = {{
    "losses": losses,
    "slices": sorted({{getattr(d, "slice_index", -1) for d in jax.devices()}}),
    "devices": len(jax.devices()),
    "platform": jax.devices()[0].platform,
}}
{extra}
print("RESULT" + json.dumps(out))
"""


def _run(code: str, env: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    import json

    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    found = re.search(r"RESULT(\{.*\})", proc.stdout)
    assert proc.returncode == 0 and found, f"{proc.stdout}\n{proc.stderr[-6000:]}"
    return dict(json.loads(found.group(1)))


def _plain_jax_losses() -> list[float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    return list(_run(_PLAIN.format(setup="", extra=""), env)["losses"])


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("proxy")
    path = folder / "cluster.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathways_nb.deploy._cli",
            "cluster",
            "--islands",
            "2",
            "--devices",
            "4",
            "--scheduler-file",
            str(path),
            "--no-dashboard",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(path, proc, timeout=180)
        yield path
    finally:
        pids = tree(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert gone(pids, 60), "the cluster did not stop"


def test_the_cli_proxy_serves_an_unchanged_script_with_pathwaysutils(cluster_file: Path) -> None:
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathways_nb.deploy._cli",
            "proxy",
            "--scheduler-file",
            str(cluster_file),
            "--port",
            "0",
            "--name",
            "alice",
            "--weight",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        banner = proxy.stdout.readline() + proxy.stdout.readline()
        line = re.search(r"JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=(\S+) (\S+)=true", banner)
        assert line, banner + (proxy.stderr.read() if proxy.poll() is not None else "")
        env = dict(os.environ, JAX_PLATFORMS="proxy", JAX_BACKEND_TARGET=line.group(1))
        env[line.group(2)] = "true"
        env.pop("XLA_FLAGS", None)
        setup = "import pathwaysutils\npathwaysutils.initialize()"
        extra = textwrap.dedent(
            """
            from pathwaysutils.elastic import manager
            m = manager.Manager()
            out["healthy_slices"] = sorted(m.active_slice_indices)
            """
        )
        got = _run(_PLAIN.format(setup=setup, extra=extra), env)
    finally:
        proxy.send_signal(signal.SIGTERM)
        _, err = proxy.communicate(timeout=60)
    assert proxy.returncode == 0, err[-4000:]
    assert got["devices"] == 8 and got["slices"] == [0, 1] and got["platform"] == "cpu"
    assert got["healthy_slices"] == [0, 1]
    np.testing.assert_allclose(got["losses"], _plain_jax_losses(), rtol=1e-6)


def test_pathways_jax_magic_turns_the_kernels_jax_to_the_cluster() -> None:
    code = textwrap.dedent(
        """
        import json
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "pathways_nb")
        ip.run_line_magic("pathways", "start --islands 2 --devices 4")
        ip.run_line_magic("pathways", "jax --name bob")
        ok = ip.run_cell('''
        import numpy as np, jax, jax.numpy as jnp
        import pathways_nb as pw
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        v = np.arange(32.0, dtype=np.float32).reshape(8, 4)
        x = jax.device_put(v, NamedSharding(mesh, P("data")))
        total = float(jax.jit(lambda v: (v * 2).sum())(x))
        client = pw.Client.current()
        names = sorted(set(client.status().tenants["name"]))
        ''')
        assert ok.success, ok.error_in_exec
        ns = ip.user_ns
        print("RESULT" + json.dumps({"total": ns["total"], "names": ns["names"],
              "devices": len(ns["jax"].devices())}))
        ip.run_line_magic("pathways", "stop")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    got = _run(code, env)
    assert got["total"] == float((np.arange(32.0) * 2).sum())
    assert got["devices"] == 8
    assert "bob" in got["names"]
