"""``pw.colocated``: a Python function run on the host of a slice, beside its devices.

A ``pw.jit`` program is XLA's to run; some work is not (NumPy or SciPy on an array's
values, a host library, writing files, logging, a check that raises). A colocated
function takes the slice's arrays where they are, as the ``jax.Array`` s the host holds,
and returns arrays that stay there, as Pathways on Cloud's colocated Python does. It is
submitted as a launch (returning RemoteArrays at once), takes its turn in the island's
order, and its failures are values as a program's are.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cloudpickle
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb._core import Payload, Slot, encode_dtype, encode_spec, fill, program_id
from pathways_nb.client import _graph
from pathways_nb.client._export import Program
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._slice import VirtualSlice

if TYPE_CHECKING:
    from pathways_nb.client._session import Client

# What tells a colocated function's program apart from an XLA program of the same bytes.
_KEY = b"pw.colocated"
# Programs a function keeps, one per distinct non-array argument values and mesh.
_MAX_PROGRAMS = 256
_PIN = "pw.colocated(f, out=..., slice=...)"


def colocated(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    out: Any,
    slice: VirtualSlice | None = None,
    name: str | None = None,
) -> Any:
    """Run ``fn`` on the host of a slice, in the host's own process, on the arrays the
    slice holds; its results stay there as RemoteArrays::

        @pw.colocated(out=lambda x: jax.ShapeDtypeStruct((), np.float32))
        def spread(x):                   # x: the host's jax.Array, on the slice's devices
            v = np.asarray(x)            # its values, read on the host (nothing is sent)
            return np.percentile(v, 99) - np.percentile(v, 1)

        s = spread(params["w"])          # a RemoteArray at once; float(s) fetches 4 bytes

    ``out`` says what ``fn`` returns, before it has run (as JAX's colocated Python asks
    for its output specs): a ``jax.ShapeDtypeStruct`` or a pytree of them, or a function
    of the call's arguments (RemoteArrays given to it as ``ShapeDtypeStruct`` s with
    their shardings) that returns one; ``out=lambda x: x`` for an output shaped and
    sharded like the input. An output's ``sharding`` is a PartitionSpec or a
    NamedSharding over the slice's mesh; none is replicated. The host places each
    returned NumPy array, ``jax.Array`` or Python number so; a return of another shape,
    dtype or structure fails the call.

    RemoteArrays, NumPy arrays and ``jax.Array`` s among the arguments are the host's
    ``jax.Array`` s in the function (from another slice they move here, as a pinned
    ``pw.jit`` function's do); other values travel pickled with the function, so each
    distinct value makes a program of its own, as ``static_argnums`` do in ``jax.jit``.
    The function goes with ``cloudpickle``: one defined in the notebook by value, one
    from an installed module by reference (the hosts need that module). It runs on the
    slice given (``slice=``), or its arguments' slice, or the default slice.

    The call takes its turn among the island's programs: those submitted before it are
    under way when it starts (reading an input waits for its value), and those after it
    wait until it returns, so a slow function holds back its island. An exception in it
    is stored in its outputs and raised, with its traceback from the host, when they are
    used.
    Hosts whose process sets ``PATHWAYS_COLOCATED_PYTHON=0`` refuse such functions.
    """
    if fn is None:
        return lambda f: colocated(f, out=out, slice=slice, name=name)
    if not callable(fn):
        raise TypeError(
            f"pw.colocated takes a function; got {type(fn).__name__}. Use it as "
            "@pw.colocated(out=...) above a def, or pw.colocated(f, out=...)"
        )
    return ColocatedFunction(fn, out, slice, name)


class ColocatedFunction:
    """A function :func:`colocated` runs on a slice's host; call it as the function."""

    def __init__(
        self, fn: Callable[..., Any], out: Any, slice: VirtualSlice | None, name: str | None
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.out = out
        self.slice = slice
        self.name = name or getattr(fn, "__name__", None) or "colocated"
        self._programs: collections.OrderedDict[tuple[Any, ...], Program] = (
            collections.OrderedDict()
        )

    def __repr__(self) -> str:
        where = f" on slice {self.slice.name!r}" if self.slice is not None else ""
        return f"<pw.colocated {self.name}{where}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pathways_nb.client._session import Client

        leaves, treedef = jax.tree.flatten((args, kwargs))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            raise TypeError(
                f"{self.name} is a pw.colocated function: it runs on a host, between "
                "programs, not inside one being traced (pw.jit, jax.jit, jax.grad). Call it "
                "on RemoteArrays outside the traced function, and pass its results in"
            )
        if self.slice is not None:
            client = self.slice._client
        else:
            first = next((x for x in leaves if isinstance(x, RemoteArray)), None)
            client = first._client if first is not None else Client.current()
        return _call(client, self, leaves, treedef)

    def _program(
        self, vs: VirtualSlice, leaves: list[Any], treedef: Any, arrays: list[RemoteArray]
    ) -> Program:
        """The program of a call with these arguments: made once per structure, array
        shapes, dtypes and shardings, other values and mesh, as jax.jit traces once per
        signature (a call with values that cannot be hashed pickles its own)."""
        statics = tuple((type(x), x) for x in leaves if not _is_array(x))
        sigs = tuple((a.shape, a.dtype, a.sharding.spec) for a in arrays)
        key = (treedef, statics, sigs, tuple(vs.mesh_shape.items()))
        try:
            prog = self._programs.get(key)
        except TypeError:  # an unhashable value among the arguments
            return self._made(vs, leaves, treedef, arrays)
        if prog is not None:
            self._programs.move_to_end(key)
            return prog
        prog = self._programs[key] = self._made(vs, leaves, treedef, arrays)
        if len(self._programs) > _MAX_PROGRAMS:
            self._programs.popitem(last=False)
        return prog

    def _made(
        self, vs: VirtualSlice, leaves: list[Any], treedef: Any, arrays: list[RemoteArray]
    ) -> Program:
        slots = iter(range(len(arrays)))
        arguments = jax.tree.unflatten(
            treedef, [Slot(next(slots)) if _is_array(x) else x for x in leaves]
        )
        out_leaves, out_tree = jax.tree.flatten(_declared(self, arguments, arrays))
        outputs = [_output(self, vs, i, leaf) for i, leaf in enumerate(out_leaves)]
        if not outputs:
            raise ValueError(
                f"{self.name}: out= declares no arrays. A colocated function returns at least "
                "one (its failure travels in it); return a flag such as np.int32(0) and "
                "declare out=jax.ShapeDtypeStruct((), np.int32)"
            )
        payload = Payload(
            self.fn,
            arguments,
            jax.tree.unflatten(out_tree, [Slot(i) for i in range(len(outputs))]),
            [(shape, encode_dtype(dtype), encode_spec(spec)) for shape, dtype, spec in outputs],
        )
        try:
            blob = cloudpickle.dumps(payload)
        except Exception as exc:
            raise TypeError(
                f"pw.colocated could not pickle {self.name} with its arguments to send it to "
                f"the host: {type(exc).__name__}: {exc}. Pass arrays as arguments rather "
                "than in the function's closure or globals, and other values that pickle"
            ) from None
        return Program(
            pid=program_id(blob, _KEY, kind="python"),
            name=self.name,
            blob=blob,
            key=_KEY,
            nin=len(arrays),
            out_tree=out_tree,
            out_avals=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outputs],
            out_specs=[spec for _, _, spec in outputs],
            donate=(),
            platform=vs.platform,
            in_specs=[encode_spec(a.sharding.spec) for a in arrays],
            kind="python",
        )


# An output's shape, dtype and PartitionSpec.
_Output = tuple[tuple[int, ...], np.dtype[Any], PartitionSpec]


def _is_array(x: Any) -> bool:
    return isinstance(x, RemoteArray | np.ndarray | jax.Array)


def _call(client: Client, f: ColocatedFunction, leaves: list[Any], treedef: Any) -> Any:
    client._check_open()
    rec = _graph.active()
    given = [x for x in leaves if _is_array(x)]
    vs = client._choose_slice(f, given, pin=_PIN)
    arrays = [
        client._onto(vs, x, None if isinstance(x, RemoteArray) else PartitionSpec(), rec)
        for x in given
    ]
    prog = f._program(vs, leaves, treedef, arrays)
    if rec is None or not rec.tracing:
        client._register(prog, vs)
    return client._launch_recorded(f.name, prog, vs, arrays, rec)


def _declared(f: ColocatedFunction, arguments: Any, arrays: list[RemoteArray]) -> Any:
    """What ``f.out`` says the function returns, for these arguments."""
    if not callable(f.out):
        return f.out
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in arrays]
    (args, kwargs), _ = fill(arguments, structs)
    return f.out(*args, **kwargs)


def _output(f: ColocatedFunction, vs: VirtualSlice, i: int, leaf: Any) -> _Output:
    """Output ``i``'s shape, dtype and PartitionSpec, from what out= gave."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(
            f"{f.name}: out= gives {leaf!r} as output {i}; each output is declared by "
            "something with a shape and a dtype, such as jax.ShapeDtypeStruct((8, 4), "
            "np.float32, sharding=P('data'))"
        )
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        raise TypeError(
            f"{f.name}: output {i} is declared as {dtype}; a colocated function returns "
            "numeric arrays. Return the key's data (jax.random.key_data) and wrap it in a "
            "pw.jit program"
        )
    # A ShapeDtypeStruct given a PartitionSpec answers .sharding only under a concrete
    # context mesh, which a client has none of: what it was given is read instead.
    sharding = (
        getattr(leaf, "_sharding", None)
        if isinstance(leaf, jax.ShapeDtypeStruct)
        else getattr(leaf, "sharding", None)
    )
    if isinstance(sharding, NamedSharding):
        spec = sharding.spec
    elif isinstance(sharding, PartitionSpec):
        spec = sharding
    elif sharding is None:
        spec = PartitionSpec()
    else:
        raise TypeError(
            f"{f.name}: output {i} is declared with sharding {sharding!r}; give a "
            "PartitionSpec over the slice's mesh, a NamedSharding, or none (replicated)"
        )
    shape = tuple(int(n) for n in shape)
    vs.check_spec(spec, shape)
    return shape, np.dtype(dtype), spec
