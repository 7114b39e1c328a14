"""A host's side of pw.colocated: unpacking a client's function, and holding what it
returns to what the client declared."""

from __future__ import annotations

import pickle

import cloudpickle
import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from pathways_nb._core import Payload, RemoteError, Slot, encode_spec
from pathways_nb.worker._python import load


def _payload(fn: object, returns: object = Slot(0), shape: tuple[int, ...] = (4,)) -> bytes:
    outputs = [(shape, "<f4", encode_spec(P("d")))]
    return cloudpickle.dumps(Payload(fn, ((Slot(0), 3.0), {}), returns, outputs))  # type: ignore[arg-type]


def test_a_function_runs_on_the_mesh_and_returns_placed_copies() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    run = load("scale", _payload(lambda v, k: v * k), allowed=True).bind(mesh)
    x = jax.device_put(np.arange(4, dtype=np.float32), jax.NamedSharding(mesh, P("d")))
    (y,) = run(x)
    np.testing.assert_array_equal(np.asarray(y), np.arange(4) * 3.0)
    assert y.sharding == jax.NamedSharding(mesh, P("d"))
    # Returning an input gives a copy: a later donation of the input leaves it whole.
    (same,) = load("same", _payload(lambda v, k: v), allowed=True).bind(mesh)(x)
    assert same is not x
    x.delete()
    np.testing.assert_array_equal(np.asarray(same), np.arange(4))


@pytest.mark.parametrize(
    ("blob", "allowed", "says"),
    [
        (b"not a pickle", True, "could not be unpickled on this host: UnpicklingError"),
        (pickle.dumps({"fn": 1}), True, "came in a form this host does not know"),
        (_payload(len), False, "PATHWAYS_COLOCATED_PYTHON=0"),
    ],
)
def test_what_a_host_cannot_run_is_refused_with_the_reason(
    blob: bytes, allowed: bool, says: str
) -> None:
    with pytest.raises(RemoteError, match=says) as info:
        load("f", blob, allowed)
    assert info.value.kind == "invalid"


class _Box:
    """A container the host has not registered as a pytree: a leaf to it."""

    def __init__(self, v: object) -> None:
        self.v = v


def test_arrays_hidden_in_a_type_the_host_does_not_know_are_named() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    outputs = [((4,), "<f4", encode_spec(P("d")))]
    blob = cloudpickle.dumps(Payload(lambda b: b.v, ((_Box(Slot(0)),), {}), Slot(0), outputs))
    run = load("boxed", blob, allowed=True).bind(mesh)
    x = jax.device_put(np.arange(4, dtype=np.float32), jax.NamedSharding(mesh, P("d")))
    with pytest.raises(RemoteError, match="inside a pytree type this host does not know"):
        run(x)
