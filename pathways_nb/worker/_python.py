"""Python functions a client runs on this host, beside its devices (``pw.colocated``).

Such a program arrives as a pickled :class:`~pathways_nb._core.Payload` where an XLA
program arrives as a ``jax.export`` artifact, and runs where a compiled executable
would: on the dispatch thread, in the gang scheduler's order, taking the store's arrays
(``jax.Array`` s on this host's devices) and returning arrays the store keeps. The
launches behind it on the island wait until it returns, so the arrays it reads are
never donated away under it, and the XLA programs it starts itself run in order with
the island's others. It never runs on the socket thread (see ``Executor``), so a slow
function holds back the island's work, not the host's messages.
"""

from __future__ import annotations

import math
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pathways_nb._core import (
    PAYLOAD_VERSION,
    Payload,
    RemoteError,
    decode_dtype,
    decode_spec,
    fill,
    is_slot,
)


class Colocated:
    """A client's Python function, unpickled, with what it must return."""

    def __init__(self, name: str, payload: Payload) -> None:
        self.name = name
        self._payload = payload
        self.out_shapes = [tuple(int(n) for n in shape) for shape, _, _ in payload.outputs]
        self.out_dtypes = [decode_dtype(d) for _, d, _ in payload.outputs]
        self._out_specs = [decode_spec(s) for _, _, s in payload.outputs]
        self.out_nbytes = [
            math.prod(s) * d.itemsize for s, d in zip(self.out_shapes, self.out_dtypes, strict=True)
        ]

    def bind(self, mesh: Mesh) -> Callable[..., list[jax.Array]]:
        """The function as an executable on ``mesh``: input arrays in, output arrays out,
        each placed with its declared sharding over the slice's devices."""
        shardings = [NamedSharding(mesh, spec) for spec in self._out_specs]

        def run(*arrays: jax.Array) -> list[jax.Array]:
            (args, kwargs), filled = fill(self._payload.arguments, arrays)
            if filled != len(arrays):
                raise RemoteError(
                    f"colocated function {self.name}: its arguments hold arrays inside a "
                    "pytree type this host does not know (one registered in the notebook "
                    "only). Pass the arrays in lists, tuples or dicts, or register the type "
                    "in a module the hosts import too",
                    kind="invalid",
                )
            try:
                result = self._payload.fn(*args, **kwargs)
            except Exception:
                raise
            except BaseException as exc:
                # sys.exit() or a KeyboardInterrupt raised in the function would end the
                # host's dispatching thread: it fails this call as any exception does.
                raise RemoteError(
                    f"colocated function {self.name} raised {type(exc).__name__}"
                    + (f": {exc}" if str(exc) else ""),
                    kind="runtime",
                    remote_traceback="".join(traceback.format_exception(exc)),
                ) from None
            return [
                # A copy always: an output that is (or views) an input's buffer would
                # go when a later launch donates the input.
                jax.device_put(self._checked(i, leaf), sh, may_alias=False)
                for i, (leaf, sh) in enumerate(zip(self._leaves(result), shardings, strict=True))
            ]

        return run

    def _leaves(self, result: Any) -> list[Any]:
        declared: Any = jax.tree.structure(self._payload.returns, is_leaf=is_slot)
        got: Any = jax.tree.structure(result)
        if got != declared:
            raise RemoteError(
                f"colocated function {self.name} returned {_describe(got)}, where its out= "
                f"declared {_describe(declared)}: declare what it returns in out=, or "
                "return that",
                kind="invalid",
            )
        return list(jax.tree.leaves(result))

    def _checked(self, i: int, leaf: Any) -> Any:
        shape, dtype = self.out_shapes[i], self.out_dtypes[i]
        if isinstance(leaf, bool | int | float | complex):
            leaf = np.asarray(leaf, dtype)  # a Python number takes the declared type
        elif not isinstance(leaf, jax.Array):
            leaf = np.asarray(leaf)
        if tuple(leaf.shape) != shape or np.dtype(leaf.dtype) != dtype:
            raise RemoteError(
                f"colocated function {self.name} returned an array of shape "
                f"{tuple(leaf.shape)} and dtype {np.dtype(leaf.dtype)} as output {i}, where "
                f"its out= declared shape {shape} and dtype {dtype}: declare what it "
                "returns in out=, or convert it (np.asarray(v, dtype), v.reshape(...))",
                kind="invalid",
            )
        return leaf


def _describe(treedef: Any) -> str:
    n = treedef.num_leaves
    return f"{n} array{'s' if n != 1 else ''} as {treedef}"


def load(name: str, blob: bytes, allowed: bool) -> Colocated:
    """The colocated function in ``blob``; RemoteError when this host does not run
    clients' Python, or when it cannot unpickle it here."""
    if not allowed:
        raise RemoteError(
            f"colocated function {name}: this host does not run Python functions from "
            "clients (its process has PATHWAYS_COLOCATED_PYTHON=0). Run it as a pw.jit "
            "program, or ask the cluster's operator to allow it",
            kind="invalid",
        )
    try:
        payload = pickle.loads(blob)
    except BaseException as exc:  # what unpickling runs is the client's code
        raise RemoteError(
            f"colocated function {name} could not be unpickled on this host: "
            f"{type(exc).__name__}: {exc}. A function from a module travels by reference: "
            "install that module on the hosts too, send it by value "
            "(cloudpickle.register_pickle_by_value(module) in the notebook), or define the "
            "function in the notebook",
            kind="invalid",
        ) from None
    if not isinstance(payload, Payload) or payload.version != PAYLOAD_VERSION:
        raise RemoteError(
            f"colocated function {name} came in a form this host does not know "
            f"(expected payload version {PAYLOAD_VERSION}): the client's pathways_nb "
            "differs from the host's; install the same version on both",
            kind="invalid",
        )
    return Colocated(name, payload)
