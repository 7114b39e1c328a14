"""``f.lower(...).compile()`` for a pw.jit function.

``jax.jit(f).lower(x).compile()`` compiles in the calling process, for its devices. A
pw.jit function's devices are its slice's, on a host: the program is exported, sent and
compiled there (the executable its calls will run, donations included), and what the
compiler says of it comes back: ``memory_analysis()`` (the bytes its arguments, outputs
and temporaries take on each device, as used to check that a model fits before running
it), ``cost_analysis()`` and ``as_text()`` (the optimized HLO). Calling the result runs
the function on the slice, as calling the pw.jit function does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb._core import decode_spec
from pathways_nb.client._interrupts import interrupts_held
from pathways_nb.client._remote import RemoteArray

if TYPE_CHECKING:
    from pathways_nb.client._export import Program
    from pathways_nb.client._jit import RemoteFunction
    from pathways_nb.client._slice import VirtualSlice


class MemoryStats:
    """``Compiled.memory_analysis()``: bytes per device, by the names of JAX's
    ``CompiledMemoryStats`` (``argument_size_in_bytes``, ``temp_size_in_bytes``, ...)."""

    def __init__(self, fields: dict[str, int]) -> None:
        self._fields = dict(fields)

    def __getattr__(self, name: str) -> int:
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(
                f"the host's compiler reported no {name}; it reported "
                f"{', '.join(sorted(self.__dict__['_fields']))}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted([*self._fields, *super().__dir__()])

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(self._fields.items()) if v)
        return f"MemoryStats({shown})"


class Compiled:
    """A pw.jit function compiled on its slice's host for these argument types."""

    def __init__(
        self,
        f: RemoteFunction,
        prog: Program,
        vs: VirtualSlice,
        signature: tuple[Any, ...],
        reply: dict[str, Any],
    ) -> None:
        self._f = f
        self._prog = prog
        self._slice = vs
        # (tree, input signatures, static arguments): what a call must match.
        self._signature = signature
        memory = reply.get("memory")
        self._memory = MemoryStats(memory) if isinstance(memory, dict) else None
        self._cost = dict(reply.get("cost") or {})
        self._hlo = str(reply.get("hlo") or "")
        specs = reply.get("out_specs") or []
        self._out_specs = [PartitionSpec() if s is None else decode_spec(s) for s in specs]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run it on the slice with arguments of the types it was compiled for (as
        ``jax.stages.Compiled``, which refuses others: the pw.jit function traces anew)."""
        got = _signature(self._f, self._slice, args, kwargs)
        if got != self._signature:
            # Host arrays are laid out as compiled, as jax.stages.Compiled shards them;
            # a RemoteArray laid out otherwise stays refused, as a committed jax.Array is.
            args, kwargs = self._placed(args, kwargs)
            got = _signature(self._f, self._slice, args, kwargs)
        if got != self._signature:
            want_text, got_text = _described(self._signature), _described(got)
            raise TypeError(
                f"{self._f.name} was compiled for {want_text} and called with {got_text}: "
                "call the pw.jit function itself to trace and compile for these, or compile "
                "for them (f.lower(...).compile())"
            )
        return self._f(*args, **kwargs)

    def _placed(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with each host array of a compiled input's shape and
        dtype put on the slice as that input is laid out."""
        from pathways_nb.client._jit import _is_remote

        f, vs = self._f, self._slice
        want_tree, want_sigs, _ = self._signature
        dyn, static = f._split(args, kwargs)
        leaves, treedef = jax.tree.flatten(dyn, is_leaf=_is_remote)
        if treedef != want_tree:
            return args, kwargs
        placed = [_placed_leaf(x, want, vs) for x, want in zip(leaves, want_sigs, strict=True)]
        return f._joined(jax.tree.unflatten(treedef, placed), static)

    def memory_analysis(self) -> MemoryStats | None:
        return self._memory

    def cost_analysis(self) -> dict[str, float]:
        return dict(self._cost)

    def as_text(self) -> str:
        return self._hlo

    @property
    def input_shardings(self) -> Any:
        """The inputs' shardings over the slice's mesh, as ``(args, kwargs)`` trees of
        the dynamic arguments (static ones left out), as ``jax.stages.Compiled`` has them."""
        treedef, sigs, _ = self._signature
        am = self._slice.abstract_mesh
        return jax.tree.unflatten(treedef, [NamedSharding(am, sig[2]) for sig in sigs])

    @property
    def output_shardings(self) -> Any:
        """The outputs' shardings over the slice's mesh, in the outputs' tree."""
        am = self._slice.abstract_mesh
        return self._prog.unflatten([NamedSharding(am, s) for s in self._out_specs])

    def __repr__(self) -> str:
        return (
            f"<pw.jit {self._f.name} compiled on host {self._slice.host} for slice "
            f"{self._slice.name!r}>"
        )


def _aval(x: Any, vs: VirtualSlice, spec: PartitionSpec | None) -> jax.ShapeDtypeStruct:
    """The abstract input a call with ``x`` would give the program on ``vs``."""
    from pathways_nb.client._jit import _abstract_leaf
    from pathways_nb.client._programs import _moved_spec

    am = vs.abstract_mesh
    if isinstance(x, RemoteArray):
        x._check_usable()
        s = x.spec if x.slice is vs else _moved_spec(x, vs, spec)
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(am, s), weak_type=x.weak_type
        )
    a = _abstract_leaf(x, vs)
    given = getattr(a, "sharding", None)
    if spec is None and isinstance(given, NamedSharding):
        spec = given.spec
    spec = spec if spec is not None else PartitionSpec()
    if a.ndim:
        vs.check_spec(spec, a.shape)
    return jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=NamedSharding(am, spec), weak_type=a.weak_type
    )


def _placed_leaf(x: Any, want: tuple[Any, ...], vs: VirtualSlice) -> Any:
    """``x`` put on ``vs`` laid out as ``want`` says, where it is a host array of
    ``want``'s shape and dtype; otherwise ``x`` itself."""
    if isinstance(x, RemoteArray | jax.ShapeDtypeStruct) or not hasattr(x, "dtype"):
        return x
    shape, dtype, spec, *weak = want
    if weak or not _is_numpy(x.dtype) or (tuple(np.shape(x)), x.dtype) != (shape, dtype):
        return x
    return vs.put(np.asarray(x), spec)


def _sig(a: jax.ShapeDtypeStruct) -> tuple[Any, ...]:
    # As a RemoteArray's _sig: shape, dtype, spec, and whether it is weakly typed.
    return (a.shape, a.dtype, a.sharding.spec, *(("weak",) if a.weak_type else ()))


def _signature(
    f: RemoteFunction, vs: VirtualSlice, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """The tree, input signatures and static arguments a call with these arguments
    gives the program on ``vs``."""
    from pathways_nb.client._jit import _is_remote

    dyn, static = f._split(args, kwargs)
    leaves, treedef = jax.tree.flatten(dyn, is_leaf=_is_remote)
    specs = f._leaf_specs(treedef)
    return treedef, tuple(_sig(_aval(x, vs, s)) for x, s in zip(leaves, specs, strict=True)), static


def _described(signature: tuple[Any, ...]) -> str:
    _, sigs, static = signature
    inputs = ", ".join(
        ("weak " if rest else "")
        + f"{np.dtype(d).name if _is_numpy(d) else d}{list(shape)} laid out as {spec}"
        for shape, d, spec, *rest in sigs
    )
    fixed = ", ".join(f"argument {k} = {v!r}" for k, v in (*static[0], *static[1]))
    return f"inputs ({inputs or 'none'})" + (f" and static {fixed}" if fixed else "")


def _is_numpy(dtype: Any) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


def compile_on_host(
    f: RemoteFunction, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any
) -> Compiled:
    """Export ``f`` for these arguments (RemoteArrays, arrays, ``jax.ShapeDtypeStruct``
    or numbers) on the slice a call would run it on, and compile it on its host."""
    from pathways_nb.client._export import export_program
    from pathways_nb.client._jit import _is_remote
    from pathways_nb.client._programs import program_key
    from pathways_nb.client._session import Client

    g = f._with_options(options) if options else f
    dyn, static = g._split(args, kwargs)
    leaves, treedef = jax.tree.flatten(dyn, is_leaf=_is_remote)
    first = next((x for x in leaves if isinstance(x, RemoteArray)), None)
    if g.slice is not None:
        client = g.slice._client
    else:
        client = first._client if first is not None else Client.current()
    vs = client._choose_slice(g, leaves)
    avals = [_aval(x, vs, s) for x, s in zip(leaves, g._leaf_specs(treedef), strict=True)]
    donate = tuple(sorted(g._donated_leaves(args, kwargs))) if g.donates else ()
    # Kept where the call looks for it: the call then launches the program compiled
    # here (the same function traced again, from another line, exports other bytes).
    sigs = tuple(_sig(a) for a in avals)
    key = program_key(treedef, sigs, static, vs, donate)
    prog = g._programs.get(key)
    if prog is None:
        with interrupts_held():
            prog = export_program(g, vs, treedef, avals, static, donate)
        g._programs[key] = prog
    client._register(prog, vs)
    reply = client._ask(
        {"t": "probe", "slice": vs.id, "pid": prog.pid, "analysis": True, "donate": list(donate)},
        timeout=None,
    )
    return Compiled(g, prog, vs, (treedef, sigs, static), reply)
