"""pw.save and pw.restore: checkpoints written and read by the hosts themselves."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import Config
from pathways_nb.client import Saving


def _state(vs: pw.VirtualSlice) -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "params": {
            "w0": vs.put(rng.standard_normal((8, 4)).astype(np.float32), P("x")),
            "b0": vs.put(np.arange(4, dtype=np.float32), P()),
        },
        "step": vs.put(np.int32(7)),
        "half": vs.put(np.linspace(0, 1, 6).astype(ml_dtypes.bfloat16), P()),
        "key": vs.put(jax.random.key(3)),
        "layers": [vs.put(np.full((2, 2), i, np.float32), P("x")) for i in range(2)],
        "empty": vs.put(np.zeros((0, 4), np.float32), P()),
    }


def test_save_then_restore_gives_the_same_arrays(client: pw.Client, tmp_path: Path) -> None:
    vs = client.allocate({"x": 2})
    state = _state(vs)
    state["params"]["w0"] = pw.jit(lambda w: jnp.tanh(w) * 2.0)(state["params"]["w0"])  # type: ignore[index]
    names = pw.save(tmp_path / "ckpt", state)
    assert sorted(names) == sorted(
        [
            "empty.npy",
            "half.npy",
            "key.npy",
            "layers.0.npy",
            "layers.1.npy",
            "params.b0.npy",
            "params.w0.npy",
            "step.npy",
        ]
    )
    want = pw.fetch(state)
    # NumPy's own files: readable without pathways_nb (JAX's own types as raw bytes).
    np.testing.assert_array_equal(
        np.load(tmp_path / "ckpt" / "params.w0.npy"), want["params"]["w0"]
    )
    assert np.load(tmp_path / "ckpt" / "half.npy").dtype == np.dtype("V2")

    back = pw.restore(tmp_path / "ckpt", state)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for got, old in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        assert got.shape == old.shape and got.dtype == old.dtype and got.spec == old.spec
        assert got.slice is vs and got.is_ready()
    got = pw.fetch(back)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The restored arrays are ordinary ones: programs take them.
    np.testing.assert_allclose(
        pw.jit(lambda p: p["w0"].sum() + p["b0"].sum())(back["params"]).fetch(),
        want["params"]["w0"].sum() + want["params"]["b0"].sum(),
        rtol=1e-6,
    )


def test_restore_onto_another_slice_and_from_shapes(client: pw.Client, tmp_path: Path) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"y": 2, "z": 2})
    assert a.host != b.host
    w = a.put(np.arange(16, dtype=np.float32).reshape(4, 4), P("x"))
    pw.save(str(tmp_path), {"w": w})
    shapes = {"w": jax.ShapeDtypeStruct((4, 4), np.float32, sharding=b.sharding(P("z", "y")))}
    moved = pw.restore(tmp_path, shapes, slice=b)["w"]
    assert moved.slice is b and moved.spec == P("z", "y")
    np.testing.assert_array_equal(moved.fetch(), w.fetch())
    plain = pw.restore(tmp_path, {"w": jax.ShapeDtypeStruct((4, 4), np.float32)}, slice=b)["w"]
    assert plain.spec == P()
    # A bare PartitionSpec, as jax.ShapeDtypeStruct takes one under jax.set_mesh.
    bare = {"w": jax.ShapeDtypeStruct((4, 4), np.float32, sharding=P(None, "y"))}
    spread = pw.restore(tmp_path, bare, slice=b)["w"]
    assert spread.spec == P(None, "y")
    np.testing.assert_array_equal(spread.fetch(), w.fetch())
    np.testing.assert_array_equal(plain.fetch(), w.fetch())
    # A tree over several slices (a pipeline's stages): each leaf by its own slice's host.
    stages = [w, b.put(np.ones((2, 2), np.float32), P("y"))]
    pw.save(tmp_path / "stages", stages)
    back = pw.restore(tmp_path / "stages", stages)
    assert [x.slice for x in back] == [a, b] and [x.spec for x in back] == [P("x"), P("y")]
    for got, want in zip(back, stages, strict=True):
        np.testing.assert_array_equal(got.fetch(), want.fetch())


def test_a_new_save_replaces_the_old_whole(client: pw.Client, tmp_path: Path) -> None:
    vs = client.allocate({"x": 2})
    w = vs.put(np.zeros(4, np.float32), P("x"))
    pw.save(tmp_path, {"w": w})
    pw.save(tmp_path, {"w": w + 1.0})
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), np.ones(4, np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npy"]  # no temporary files left


@pytest.mark.parametrize("wait", [True, False])
def test_a_failed_save_leaves_the_checkpoint_before_it_whole(
    client: pw.Client, tmp_path: Path, wait: bool
) -> None:
    vs = client.allocate({"x": 2})
    old = {"a": vs.put(np.zeros(4, np.float32), P("x")), "b": vs.put(np.zeros(4, np.float32))}
    pw.save(tmp_path, old)
    client.inject_fault(vs, match="broken")
    new = {"a": old["a"] + 1.0, "b": pw.jit(lambda v: v + 1.0, name="broken")(old["b"])}
    with pytest.raises(pw.RemoteError, match="injected fault"):
        saving = pw.save(tmp_path, new, wait=wait)
        assert isinstance(saving, Saving)
        saving.result()
    # "a" was written, under a pending name that goes with the failed save: a write
    # still ending removes its own file, so wait for the folder to settle.
    deadline = time.monotonic() + 30
    while len(list(tmp_path.iterdir())) > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]
    back = pw.fetch(pw.restore(tmp_path, old))
    np.testing.assert_array_equal(back["a"], np.zeros(4))
    np.testing.assert_array_equal(back["b"], np.zeros(4))
    pw.save(tmp_path, {"a": new["a"]})  # the next save commits as usual
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.ones(4))


def test_failures_are_readable(client: pw.Client, tmp_path: Path) -> None:
    vs = client.allocate({"x": 2})
    w = vs.put(np.ones(4, np.float32), P("x"))
    client.inject_fault(vs, match="broken")
    broken = pw.jit(lambda v: v * 2.0, name="broken")(w)
    with pytest.raises(pw.RemoteError, match="injected fault"):
        pw.save(tmp_path, {"w": w, "broken": broken})
    (tmp_path / "file").write_text("")
    with pytest.raises(
        pw.RemoteError, match=r"NotADirectoryError.*file/ckpt.*\(program save, host host\d\)"
    ):
        pw.save(tmp_path / "file" / "ckpt", {"w": w})
    with pytest.raises(
        pw.RemoteError, match=r"FileNotFoundError.*missing/w\.npy.*\(program restore, host host\d\)"
    ):
        pw.restore(tmp_path / "missing", {"w": w})
    pw.save(tmp_path / "ok", {"w": w})
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "w.npy").write_bytes(b"not an array")
    with pytest.raises(pw.RemoteError, match=r"w\.npy is not a NumPy \.npy file") as info:
        pw.restore(tmp_path / "junk", {"w": w})
    assert "allow_pickle" not in str(info.value)  # NumPy's advice to load it unsafely
    wrong = {"w": vs.put(np.ones((2, 2), np.float32))}
    with pytest.raises(
        pw.RemoteError, match=r"holds float32\[4\], where the array to restore is float32\[2, 2\]"
    ):
        pw.restore(tmp_path / "ok", wrong)
    # Bad input, said at once.
    with pytest.raises(ValueError, match="path is absolute"):
        pw.save("relative/ckpt", {"w": w})
    with pytest.raises(TypeError, match="the leaf 'lr' is a float"):
        pw.save(tmp_path, {"w": w, "lr": 0.1})
    with pytest.raises(TypeError, match="the leaf 'w' is a ndarray"):
        pw.restore(tmp_path / "ok", {"w": np.ones(4)})
    with pytest.raises(ValueError, match="names no slice"):
        pw.restore(tmp_path / "ok", {"w": jax.ShapeDtypeStruct((4,), np.float32)})
    with pytest.raises(ValueError, match=r"would share the file a_b\.npy"):
        pw.save(tmp_path, {"a_b": w, "a-b": w, "a b": w})
    with pytest.raises(ValueError, match="without arrays"):
        pw.save(tmp_path, {})
    gone = w + 1.0
    gone.delete()
    with pytest.raises(pw.ClosedError, match="was deleted"):
        pw.save(tmp_path, {"gone": gone})
    # The store holds nothing of the failed restores.
    np.testing.assert_array_equal(w.fetch(), np.ones(4, np.float32))


def test_a_checkpoint_root_confines_where_hosts_write_and_read(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    (root / "escape").symlink_to(outside, target_is_directory=True)
    with (
        pw.InProcessCluster(1, 2, config=Config(checkpoint_root=str(root))) as c,
        c.client() as client,
    ):
        vs = client.allocate({"x": 2})
        w = vs.put(np.arange(4, dtype=np.float32), P("x"))
        pw.save(root / "run1", {"w": w})
        np.testing.assert_array_equal(
            pw.restore(root / "run1", {"w": w})["w"].fetch(), np.arange(4, dtype=np.float32)
        )
        for where in (outside, root / "escape" / "run", root / ".." / "outside"):
            with pytest.raises(pw.RemoteError, match=r"outside this cluster's checkpoint folder"):
                pw.save(where, {"w": w})
        assert not outside.exists()
        np.save(tmp_path / "w.npy", np.zeros(4, np.float32))
        with pytest.raises(pw.RemoteError, match=r"outside this cluster's checkpoint folder"):
            pw.restore(tmp_path, {"w": w})
    with pytest.raises(ValueError, match="checkpoint_root must be an absolute path"):
        Config(checkpoint_root="relative")


def test_hosts_refuse_a_checkpoint_root_that_does_not_exist(tmp_path: Path) -> None:
    """Said as the hosts start (a hand-started worker's host too), not at the first save."""
    from pathways_nb.worker import Host

    config = Config(checkpoint_root=str(tmp_path / "nope"))
    match = r"'.*nope' does not exist on this machine, where the hosts run"
    with pytest.raises(ValueError, match=match):
        pw.InProcessCluster(1, 2, config=config)
    with pytest.raises(ValueError, match=match):
        Host("h", "inproc://nowhere", devices=[], config=config)


def test_a_background_save_copies_first_so_the_next_step_may_donate(
    client: pw.Client, tmp_path: Path
) -> None:
    vs = client.allocate({"x": 2})
    state = {"w": vs.put(np.arange(8, dtype=np.float32), P("x")), "n": vs.put(np.int32(0))}
    step = pw.jit(lambda s: {"w": s["w"] * 2.0, "n": s["n"] + 1}, donate_argnums=0)
    state = step(state)
    want = pw.fetch(state)
    saving = pw.save(tmp_path / "ckpt", state, wait=False)
    assert isinstance(saving, Saving)
    for _ in range(3):  # training goes on, donating the saved arrays
        state = step(state)
    assert sorted(saving.result()) == ["n.npy", "w.npy"]
    assert sorted(saving.result()) == ["n.npy", "w.npy"]  # asked again: the same answer
    assert "written" in repr(saving)
    np.testing.assert_array_equal(np.load(tmp_path / "ckpt" / "w.npy"), want["w"])
    assert int(np.load(tmp_path / "ckpt" / "n.npy")) == 1
    assert int(state["n"].fetch()) == 4

    (tmp_path / "file").write_text("")
    failing = pw.save(tmp_path / "file" / "ckpt", state, wait=False)
    for _ in range(2):
        with pytest.raises(pw.RemoteError, match=r"NotADirectoryError.*\(program save"):
            failing.result()
    assert "failed" in repr(failing)
