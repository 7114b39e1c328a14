"""Plain JAX through the IFRT proxy: jaxlib's own client (``JAX_PLATFORMS=proxy``) in a
process of its own, the proxy and the cluster in this one. Every value is compared with
the same code run by plain JAX on this process's CPU devices."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pathways_nb as pw
from pathways_nb.proxy import ProxyServer, serve

# What a JAX process runs before the code under test: the proxy backend registered as
# pathwaysutils.initialize() registers it, and what it returns written out.
_PRELUDE = """
import os, pickle, sys
import jax
from jax.extend import backend
from jax.extend.backend import ifrt_proxy

if os.environ.get("JAX_PLATFORMS") == "proxy":
    backend.register_backend_factory(
        "proxy",
        lambda: ifrt_proxy.get_client(
            os.environ["JAX_BACKEND_TARGET"], ifrt_proxy.ClientConnectionOptions()
        ),
        priority=-1,
    )
"""

_EAGER = """
import numpy as np, jax, jax.numpy as jnp
x = jnp.arange(12.0).reshape(3, 4)
results = {
    "add": x + 1, "mul": x * x, "sum": x.sum(), "mean0": x.mean(0), "max1": x.max(1),
    "slice": x[1:3, ::2], "set": x.at[0, 1].set(-1.0), "where": jnp.where(x > 5, x, 0.0),
    "norm": jnp.linalg.norm(x), "bf16": x.astype(jnp.bfloat16) * 3,
    "int8": (jnp.arange(10, dtype=jnp.int8) * 7), "bool": (x > 4) & (x < 9),
    "f16": jnp.ones(5, jnp.float16) / 3, "scalar": jnp.float32(2.5) * 2,
    "empty": jnp.zeros((0,), jnp.float32) + 1, "int64ish": jnp.arange(5) * 3,
    "matmul": x @ x.T, "cumsum": jnp.cumsum(x, axis=1),
}
results = {k: np.asarray(v) for k, v in results.items()}
"""

_JIT = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
results = {}
devices = jax.devices()
rng = np.random.default_rng(0)
w = rng.standard_normal((16, 8)).astype(np.float32)
xs = rng.standard_normal((32, 16)).astype(np.float32)

def layer(w, x):
    return jnp.tanh(x @ w).sum(0)

for n in (1, 2, 4):
    mesh = Mesh(np.array(devices[:n]), ("data",))
    x = jax.device_put(xs, NamedSharding(mesh, P("data")))
    wr = jax.device_put(w, NamedSharding(mesh, P()))
    out = jax.jit(layer, out_shardings=NamedSharding(mesh, P()))(wr, x)
    results[f"mesh{n}"] = np.asarray(out)
    results[f"mesh{n}_spec"] = str(out.sharding.spec)
    results[f"mesh{n}_devices"] = sorted(d.id for d in out.sharding.device_set)
    y = jax.jit(lambda a: a * 2 + 1)(x)
    results[f"mesh{n}_sharded"] = np.asarray(y)
    results[f"mesh{n}_shards"] = sorted(
        (s.device.id, s.index[0].start or 0, np.asarray(s.data).sum().item())
        for s in y.addressable_shards
    )

tree = {"a": np.arange(6.0), "b": [np.ones((2, 2), np.float32), np.int32(7)]}
put = jax.device_put(tree)
doubled = jax.jit(lambda t: jax.tree.map(lambda v: v * 2, t))(put)
jax.block_until_ready(doubled)
got = jax.device_get(doubled)
results["tree_a"] = got["a"]
results["tree_b0"] = got["b"][0]
results["tree_b1"] = np.asarray(got["b"][1])

mesh = Mesh(np.array(devices[:4]), ("data",))
z = jax.device_put(xs, NamedSharding(mesh, P("data")))
step = jax.jit(lambda z: z * 3, donate_argnums=0)
z2 = step(z)
results["donated_deleted"] = z.is_deleted()
results["donated_value"] = np.asarray(z2)
results["again"] = np.asarray(step(z2))

# The same devices in another order: JAX remaps the shards into their new slots.
dev = np.array(devices[:4])
s1 = NamedSharding(Mesh(dev.reshape(2, 2), ("a", "b")), P("b"))
s2 = NamedSharding(Mesh(dev[::-1].reshape(2, 2), ("a", "b")), P("b"))
xr = jax.device_put(np.arange(16.0, dtype=np.float32).reshape(8, 2), s1)
results["reordered"] = np.asarray(jax.device_put(xr, s2))
results["reordered_donated"] = np.asarray(jax.device_put(xr, s2, donate=True))
"""

_PRNG = """
import numpy as np, jax, jax.numpy as jnp
key = jax.random.key(42)
k1, k2 = jax.random.split(key)
results = {
    "normal": np.asarray(jax.random.normal(k1, (5,))),
    "uniform": np.asarray(jax.random.uniform(k2, (2, 3))),
    "categorical": np.asarray(
        jax.random.categorical(k1, jnp.log(jnp.array([0.2, 0.5, 0.3])), shape=(8,))
    ),
    "bernoulli": np.asarray(jax.random.bernoulli(k2, 0.3, (10,))),
    "key_data": np.asarray(jax.random.key_data(k1)),
    "in_jit": np.asarray(jax.jit(lambda k: jax.random.normal(k, (3,)))(k2)),
    "old_style": np.asarray(jax.random.normal(jax.random.PRNGKey(0), (4,))),
}
"""

_FLAX = """
import numpy as np, jax, jax.numpy as jnp, optax
from flax import nnx

class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)
    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))

model = MLP(nnx.Rngs(0))
opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
rng = np.random.default_rng(1)
x = rng.standard_normal((64, 8)).astype(np.float32)
y = (x.sum(1, keepdims=True) > 0).astype(np.float32)

@nnx.jit
def train_step(model, opt, x, y):
    def loss_fn(m):
        return ((m(x) - y) ** 2).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

losses = [float(train_step(model, opt, x, y)) for _ in range(10)]
results = {"losses": np.array(losses), "w1": np.asarray(model.l1.kernel[...])}
"""

_ERRORS = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
results = {}
devices = jax.devices()
try:
    mesh = Mesh(np.array(devices[2:6]), ("data",))
    # The put is not waited for (as on any IFRT backend): its use says why it failed.
    np.asarray(jax.device_put(np.ones((8, 2), np.float32), NamedSharding(mesh, P("data"))))
    results["spanning"] = "no error"
except Exception as exc:
    results["spanning"] = f"{type(exc).__name__}: {exc}"
try:
    big = jax.jit(lambda v: jnp.broadcast_to(v, (1 << 38,)) * 2)(jnp.float32(1))
    big.block_until_ready()
    results["too_big"] = "no error"
except Exception as exc:
    results["too_big"] = f"{type(exc).__name__}: {exc}"
results["after"] = np.asarray(jax.jit(lambda v: v + 1)(jnp.arange(3.0)))
"""


_LINALG_AND_VIEWS = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
results = {
    # LAPACK's kernels, which a host initializes before compiling them.
    "inv": jnp.linalg.inv(m), "cholesky": jnp.linalg.cholesky(m),
    "eigh": jnp.linalg.eigh(m)[0], "slogdet": jnp.stack(jax.jit(jnp.linalg.slogdet)(m)),
    "solve": jnp.linalg.solve(m, jnp.ones(3)), "svd": jnp.linalg.svd(m, compute_uv=False),
    "fft": jnp.abs(jnp.fft.fft(jnp.arange(8.0))),
}
mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
p = jax.device_put(jnp.ones(32), NamedSharding(mesh, P()))
results["zeros_like"] = jnp.zeros_like(p)      # takes one shard of a temporary, dropped
a = jnp.ones(32) * 2
s = a.addressable_data(0)
del a                                           # the shard outlives its array
results["shard_after_del"] = s + 1
results["no_outputs"] = str(jax.jit(lambda: None)())
# Each device's partial sum, read shard by shard: the buffers themselves.
pair = jax.make_mesh(
    (2,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2]
)
with jax.set_mesh(pair):
    xu = jax.device_put(np.arange(8, dtype=np.float32), P("x"))
    summed = jax.jit(lambda v: jax.lax.reduce_sum(v, axes=(0,), out_sharding=P(unreduced={"x"})))
    results["unreduced_shards"] = np.stack(
        [np.asarray(s.data) for s in summed(xu).addressable_shards]
    )
"""


def _cpu(body: str) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(compile(textwrap.dedent(body), "<plain JAX>", "exec"), scope)
    return {k: np.asarray(v) if hasattr(v, "__array__") else v for k, v in scope["results"].items()}


def start_jax(server: ProxyServer, body: str, tmp_path: Any) -> subprocess.Popen[str]:
    """``body`` run by plain JAX through the proxy, in a process of its own."""
    script = tmp_path / "script.py"
    script.write_text(
        _PRELUDE
        + textwrap.dedent(body)
        + "\nimport numpy as _np\n"
        + "results = {k: (_np.asarray(v) if hasattr(v, '__array__') else v) "
        + "for k, v in results.items()}\n"
        + f"pickle.dump(results, open({str(tmp_path / 'results.pkl')!r}, 'wb'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="proxy",
        JAX_BACKEND_TARGET=f"grpc://127.0.0.1:{server.port}",
        IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS="true",
    )
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_jax(proc: subprocess.Popen[str], tmp_path: Any, timeout: float = 240) -> dict[str, Any]:
    """The ``results`` of a JAX process, with what it printed if it failed."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"the JAX process failed:\n{out}\n{err[-6000:]}"
    with open(tmp_path / "results.pkl", "rb") as f:
        return dict(pickle.load(f))


def run_jax(server: ProxyServer, body: str, tmp_path: Any) -> dict[str, Any]:
    return finish_jax(start_jax(server, body, tmp_path), tmp_path)


@pytest.fixture(scope="module")
def proxy(cluster: pw.InProcessCluster) -> Iterator[ProxyServer]:
    server = serve(cluster, name="plain-jax", weight=2.0)
    yield server
    server.stop()


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        g, w = got[key], want[key]
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype, key
            assert g.shape == w.shape, key
            np.testing.assert_array_equal(g, w, err_msg=key)
        else:
            assert g == w, key


def test_eager_operations_match_plain_jax(proxy: ProxyServer, tmp_path: Any) -> None:
    _same(run_jax(proxy, _EAGER, tmp_path), _cpu(_EAGER))


def test_jit_over_meshes_pytrees_and_donation_match_plain_jax(
    proxy: ProxyServer, tmp_path: Any
) -> None:
    got = run_jax(proxy, _JIT, tmp_path)
    _same(got, _cpu(_JIT))
    assert got["donated_deleted"] is True
    assert got["mesh4_devices"] == [0, 1, 2, 3]


def test_linear_algebra_and_shards_outliving_their_arrays_match_plain_jax(
    proxy: ProxyServer, tmp_path: Any
) -> None:
    got, want = run_jax(proxy, _LINALG_AND_VIEWS, tmp_path), _cpu(_LINALG_AND_VIEWS)
    assert sorted(got) == sorted(want)
    for key in want:
        if isinstance(want[key], np.ndarray):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
        else:
            assert got[key] == want[key], key


def test_random_keys_match_plain_jax(proxy: ProxyServer, tmp_path: Any) -> None:
    _same(run_jax(proxy, _PRNG, tmp_path), _cpu(_PRNG))


def test_flax_nnx_with_optax_trains_as_on_plain_jax(proxy: ProxyServer, tmp_path: Any) -> None:
    got, want = run_jax(proxy, _FLAX, tmp_path), _cpu(_FLAX)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-6)
    np.testing.assert_allclose(got["w1"], want["w1"], rtol=1e-6, atol=1e-7)
    assert got["losses"][-1] < got["losses"][0]


def test_errors_are_clear_and_the_proxy_goes_on(proxy: ProxyServer, tmp_path: Any) -> None:
    got = run_jax(proxy, _ERRORS, tmp_path)
    assert "islands" in got["spanning"] and "one island" in got["spanning"], got["spanning"]
    assert got["too_big"].startswith("JaxRuntimeError"), got["too_big"]
    assert "RESOURCE_EXHAUSTED" in got["too_big"], got["too_big"]
    np.testing.assert_array_equal(got["after"], np.arange(3.0, dtype=np.float32) + 1)


def test_each_session_is_a_tenant_whose_programs_are_in_the_event_log(
    proxy: ProxyServer, cluster: pw.InProcessCluster, tmp_path: Any
) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    body = f"""
import time
import jax, jax.numpy as jnp, numpy as np
def scaled_tanh(x):
    return jnp.tanh(x) * 2
results = {{"y": np.asarray(jax.jit(scaled_tanh)(jnp.ones(4)))}}
open({str(ready)!r}, "w").close()
while not os.path.exists({str(go)!r}):
    time.sleep(0.02)
"""
    proc = start_jax(proxy, body, tmp_path)
    with cluster.client() as observer:
        try:
            while not ready.exists():
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.02)
            tenants = observer.status().tenants
            mine = tenants[tenants["name"] == "plain-jax"]
            assert len(mine) == 1
            assert mine["weight"].iloc[0] == 2.0
            assert mine["devices"].iloc[0] == 8  # one slice per island, all of it
        finally:
            go.touch()
        finish_jax(proc, tmp_path)
        events = observer.events(all_tenants=True)
        ran = events[(events.kind == "end") & (events.program == "jit_scaled_tanh")]
        assert len(ran) == 1
        while proxy.sessions:  # the JAX process ended: its session ends with it
            time.sleep(0.02)
        tenants = observer.status().tenants
        assert "plain-jax" not in set(tenants["name"])


_ISLANDS = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
by = {}
for d in jax.devices():
    by.setdefault(d.slice_index, []).append(d)
m0, m1 = Mesh(np.array(by[0]), ("data",)), Mesh(np.array(by[1]), ("data",))
xs = np.arange(64.0, dtype=np.float32).reshape(16, 4)
x0 = jax.device_put(xs, NamedSharding(m0, P("data")))
x1 = jax.device_put(x0, NamedSharding(m1, P("data")))     # moved to island 1
y1 = jax.jit(lambda a: a * 2)(x1)
c0 = jax.device_put(x0, x0.sharding, may_alias=False)     # a copy on island 0
results = {
    "y1": np.asarray(y1), "c0": np.asarray(c0),
    "y1_on": sorted({d.slice_index for d in y1.sharding.device_set}),
}
"""


def test_arrays_move_between_islands_host_to_host(
    proxy: ProxyServer, cluster: pw.InProcessCluster, tmp_path: Any, monkeypatch: Any
) -> None:
    from pathways_nb.proxy._cluster import ClusterBackend

    read: dict[int, int] = {}  # elements read through the proxy, by island
    fetch = ClusterBackend.fetch

    def counted(self: ClusterBackend, e: Any) -> Any:
        read[e.island] = read.get(e.island, 0) + int(np.prod(e.shape))
        return fetch(self, e)

    monkeypatch.setattr(ClusterBackend, "fetch", counted)
    got = run_jax(proxy, _ISLANDS, tmp_path)
    xs = np.arange(64.0, dtype=np.float32).reshape(16, 4)
    np.testing.assert_array_equal(got["y1"], xs * 2)
    np.testing.assert_array_equal(got["c0"], xs)
    assert list(got["y1_on"]) == [1]
    # Each island's values came through the proxy once, for the reads; the move and
    # the copy went host to host.
    assert read == {0: xs.size, 1: xs.size}, read
    with cluster.client() as observer:
        events = observer.events(all_tenants=True)
    moves = events[(events.kind == "launch") & (events.program == "transfer")]
    hosts = [h.name for h in cluster.hosts]
    assert f"{hosts[0]}→{hosts[1]}" in set(moves["detail"]), set(moves["detail"])
    assert f"{hosts[0]}→{hosts[0]}" in set(moves["detail"]), set(moves["detail"])


def test_a_lost_host_is_data_loss_for_jax_and_new_work_runs_once_remapped(
    tmp_path: Any,
) -> None:
    flags = {n: tmp_path / n for n in ("ready1", "go1", "ready2", "go2")}

    def wait(name: str) -> str:
        return f"""
open({str(flags["ready" + name])!r}, "w").close()
while not os.path.exists({str(flags["go" + name])!r}):
    time.sleep(0.02)
"""

    body = (
        """
import time
import numpy as np, jax, jax.numpy as jnp
x = jax.device_put(np.arange(4.0, dtype=np.float32), jax.devices()[0])
y = jax.jit(lambda v: v * 2)(x)
y.block_until_ready()
"""
        + wait("1")
        + """
results = {}
try:
    jax.jit(lambda v: v + 1)(y).block_until_ready()
    results["lost"] = "no error"
except Exception as exc:
    results["lost"] = f"{type(exc).__name__}: {exc}"
"""
        + wait("2")
        + """
z = jax.jit(lambda v: v * 3)(jax.device_put(np.ones(4, np.float32), jax.devices()[0]))
results["after"] = np.asarray(z)
"""
    )

    def until(path: Any, proc: subprocess.Popen[str]) -> None:
        while not path.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)

    with pw.InProcessCluster(2, 2) as c:
        server = serve(c, name="elastic")
        try:
            proc = start_jax(server, body, tmp_path)
            until(flags["ready1"], proc)
            with c.client() as observer:
                status = observer.status()
            # The host of the session's slice_index 0: its slice on the first island.
            tenants = status.tenants
            tenant = int(tenants[tenants["name"] == "elastic"]["tenant"].iloc[0])
            slices = status.slices[status.slices["tenant"] == tenant]
            order = list(status.islands["island"])
            first = min(slices["island"], key=order.index)
            host = slices[slices["island"] == first]["host"].iloc[0]
            index = [h.name for h in c.hosts].index(host)
            c.controller.host_lost(host, "test")
            flags["go1"].touch()
            until(flags["ready2"], proc)
            c.restart_host(index)
            flags["go2"].touch()
            got = finish_jax(proc, tmp_path)
        finally:
            server.stop()
    assert got["lost"].startswith("JaxRuntimeError: DATA_LOSS"), got["lost"]
    np.testing.assert_array_equal(got["after"], np.full(4, 3.0, np.float32))


def test_a_remap_plan_moves_shards_into_the_slots_it_names(cluster: pw.InProcessCluster) -> None:
    from pathways_nb.proxy._layouts import Layout, dtype_proto, shape_proto, sharding_proto
    from pathways_nb.proxy._protos import message
    from pathways_nb.proxy._serve import backend_factory
    from pathways_nb.proxy._session import Session

    def split(n: int) -> bytes:
        op = message("xla.OpSharding")(type=3, tile_assignment_dimensions=[n])
        op.tile_assignment_devices.extend(range(n))
        return op.SerializeToString()

    def spec(shape: tuple[int, ...], layout: Layout) -> Any:
        out = message("xla.ifrt.ArraySpecProto")()
        out.dtype.CopyFrom(dtype_proto(np.dtype(np.float32)))
        out.shape.CopyFrom(shape_proto(shape))
        out.sharding.CopyFrom(sharding_proto(layout))
        return out

    session = Session(1, backend_factory(cluster, name="remap"), {})
    req = message("xla.ifrt.proxy.IfrtRequest")()
    req.init_request.SetInParent()
    assert not session.handle(req).response_metadata.status.code
    try:
        a, b = np.arange(4.0, dtype=np.float32), np.arange(10.0, 14.0, dtype=np.float32)
        la, lb, lo = (
            Layout((0, 1), split(2)),
            Layout((2, 3), split(2)),
            Layout((0, 1, 2, 3), split(4)),
        )
        session.store(1, session.backend.put(a, la))
        session.store(2, session.backend.put(b, lb))
        req = message("xla.ifrt.proxy.IfrtRequest")()
        remap = req.remap_arrays_request
        remap.array_handles.extend([1, 2])
        remap.result_handles.append(3)
        remap.plan.input_specs.extend([spec((4,), la), spec((4,), lb)])
        remap.plan.output_specs.append(spec((8,), lo))
        for i, at in ((0, 0), (1, 2)):  # a's two shards, then b's, into the four slots
            m = remap.plan.mappings.add(in_array=i, out_array=0)
            m.from_start.append(0), m.from_end.append(2), m.from_step.append(1)
            m.to_start.append(at), m.to_end.append(at + 2), m.to_step.append(1)
        resp = session.handle(req)
        assert not resp.response_metadata.status.code, resp.response_metadata.status.message
        out = session.entry(3)
        assert out.layout == lo
        np.testing.assert_array_equal(session.backend.fetch(out), np.concatenate([a, b]))
    finally:
        session.close()
