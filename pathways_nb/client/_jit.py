"""``pw.jit``: trace and export a function for a slice's mesh; launch it asynchronously."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb._core import compiler_options as compiler_options_checked
from pathways_nb.client._aot import Traced
from pathways_nb.client._argnums import argnums_and_names
from pathways_nb.client._compiled import compile_on_host
from pathways_nb.client._export import (
    Program,
    _aval_text,
    _broadcast_specs,
    _is_spec_leaf,
    _spec_of,
    laid_out,
)
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._slice import VirtualSlice


class RemoteFunction:
    """What ``pw.jit`` returns: call it with RemoteArrays; it returns RemoteArrays at once."""

    def __init__(
        self,
        fun: Callable[..., Any],
        *,
        in_shardings: Any = None,
        out_shardings: Any = None,
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None,
        slice: VirtualSlice | None = None,
        name: str | None = None,
        keep_unused: bool = False,
        inline: bool = False,
        compiler_options: dict[str, Any] | None = None,
        device: Any = None,
        backend: Any = None,
        abstracted_axes: Any = None,
    ) -> None:
        for what, value in (("device", device), ("backend", backend)):
            if value is not None:
                raise ValueError(
                    f"pw.jit places a program on a slice, not on a {what}: drop {what}= "
                    "(jax.jit deprecates it too) and give slice=vs, or call the function "
                    "with arrays on the slice it should run on"
                )
        if abstracted_axes is not None:
            raise ValueError(
                "pw.jit exports programs for fixed shapes (jax.export of a jax.jit "
                "function); abstracted_axes (dynamic shapes, experimental in jax.jit) "
                "cannot be exported: drop it, and a new shape traces a new program"
            )
        if not callable(fun):
            raise TypeError(f"pw.jit expects a function; got {type(fun).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"pw.jit's name= is a string; got {type(name).__name__}")
        self.fun = fun
        self.name: str = name or str(getattr(fun, "__name__", "program"))
        self.keep_unused = bool(keep_unused)
        self.inline = bool(inline)
        # Compiled with on the hosts (the exported program does not carry them).
        self.compiler_options = compiler_options_checked(compiler_options)
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        try:
            self._signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self._signature = None
        self.static_argnums, self.static_argnames = argnums_and_names(
            self._signature, self.name, static_argnums, static_argnames, "static"
        )
        self.donate_argnums, self.donate_argnames = argnums_and_names(
            self._signature, self.name, donate_argnums, donate_argnames, "donate"
        )
        self.donates = bool(self.donate_argnums or self.donate_argnames)
        overlap = set(self.static_argnums) & set(self.donate_argnums)
        overlap_names = set(self.static_argnames) & set(self.donate_argnames)
        if overlap or overlap_names:
            both: list[Any] = [*sorted(overlap), *sorted(overlap_names)]
            raise ValueError(f"arguments {both} cannot be both static and donated")
        if slice is not None and not isinstance(slice, VirtualSlice):
            raise TypeError(
                "pw.jit's slice= takes a VirtualSlice from client.allocate(...); got "
                f"{type(slice).__name__} {slice!r}"
            )
        self.slice = slice
        self._programs: dict[Any, Program] = {}
        functools.update_wrapper(self, fun)

    def __repr__(self) -> str:
        return f"<pw.jit {self.name} ({len(self._programs)} programs)>"

    def clear_cache(self) -> None:
        """Forget the programs traced so far, as ``jax.jit``'s ``clear_cache``: the next
        call traces again (say, after a global the function reads has changed). A host
        keeps what it compiled, and a trace that gives the same program reuses it."""
        self._programs.clear()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pathways_nb.client._session import Client

        for a in args:
            if type(a) is RemoteArray:  # the common case, checked first: a launch
                vs = self.slice
                return (a if vs is None else vs)._client._call(self, args, kwargs)
        # One walk over the arguments: a tracer among them means the call is part of
        # a function being traced (inline it); else the first RemoteArray names the client.
        leaves = jax.tree.leaves((args, kwargs), is_leaf=_is_remote)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self._inline(args, kwargs)
        if self.slice is not None:
            return self.slice._client._call(self, args, kwargs)
        first = next((x for x in leaves if isinstance(x, RemoteArray)), None)
        client = first._client if first is not None else Client.current()
        return client._call(self, args, kwargs)

    def _inline(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called inside another traced function (a pw.jit or jax.jit function, a
        jax.grad, ...): trace into the caller's program, as a nested jax.jit does. Its
        shardings become sharding constraints on the mesh the caller's inputs live on;
        where they carry none, the caller's own shardings decide."""
        dyn, static = self._split(args, kwargs)
        leaves, treedef = jax.tree.flatten(dyn)
        mesh = _mesh_of(leaves)
        specs = self._leaf_specs(treedef)

        def constrain(x: Any, spec: PartitionSpec | None) -> Any:
            if mesh is None or spec is None or not getattr(x, "ndim", 0):
                return x
            return laid_out(x, NamedSharding(mesh, spec))

        def body(*xs: Any) -> Any:
            xs = tuple(constrain(x, sp) for x, sp in zip(xs, specs, strict=True))
            out = self._apply(jax.tree.unflatten(treedef, list(xs)), static)
            if self.out_shardings is None or mesh is None:
                return out
            flat_out, out_tree = jax.tree.flatten(out)
            want = _broadcast_specs(self.out_shardings, out_tree)
            return jax.tree.unflatten(
                out_tree, [constrain(x, sp) for x, sp in zip(flat_out, want, strict=True)]
            )

        body.__name__ = self.name
        return jax.jit(body, inline=self.inline, keep_unused=self.keep_unused)(*leaves)

    # the JAX-like extras ------------------------------------------------------------
    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them; nothing runs."""
        dyn, static = self._split(args, kwargs)
        vs = self._slice_of(jax.tree.leaves(dyn, is_leaf=_is_remote))
        abstract = jax.tree.map(lambda x: _abstract_leaf(x, vs), dyn, is_leaf=_is_remote)
        return jax.eval_shape(lambda d: self._apply(d, static), abstract)

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """``jax.jit(...).trace``: the function traced for these arguments' shapes
        (``.jaxpr``, ``.out_info``); ``.lower()`` lowers it for the slice's platform.
        Nothing runs."""
        dyn, static = self._split(args, kwargs)
        leaves, treedef = jax.tree.flatten(dyn, is_leaf=_is_remote)
        vs = self._slice_of(leaves)
        avals = [_abstract_leaf(x, vs) for x in leaves]
        fn = jax.jit(
            lambda *xs: self._apply(jax.tree.unflatten(treedef, list(xs)), static),
            keep_unused=self.keep_unused,
        )
        platform = vs.platform if vs is not None else jax.default_backend()
        compile_on_slice = functools.partial(compile_on_host, self, args, kwargs)
        return Traced(self.name, fn.trace(*avals), platform, compile_on_slice)

    def _slice_of(self, leaves: Sequence[Any]) -> VirtualSlice | None:
        """The slice a call with these leaves would run on, where one is known."""
        remote = next((x for x in leaves if _is_remote(x)), None)
        return self.slice or (remote.slice if remote is not None else None)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(...).lower`` for the slice's abstract mesh (no devices needed);
        ``.compile()`` compiles it on the slice's host."""
        return self.trace(*args, **kwargs).lower()

    def _with_options(self, options: Any) -> RemoteFunction:
        """This function compiled with more XLA options (``Lowered.compile(options)``)."""
        return RemoteFunction(
            self.fun,
            in_shardings=self.in_shardings,
            out_shardings=self.out_shardings,
            static_argnums=self.static_argnums,
            static_argnames=self.static_argnames,
            donate_argnums=self.donate_argnums,
            donate_argnames=self.donate_argnames,
            slice=self.slice,
            name=self.name,
            keep_unused=self.keep_unused,
            inline=self.inline,
            compiler_options={**self.compiler_options, **compiler_options_checked(options)},
        )

    # helpers used by the client ------------------------------------------------------
    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """Separate static from dynamic arguments: ((args, kwargs) dynamic, static key)."""
        if not self.static_argnums and not self.static_argnames:
            return (args, kwargs), ((), (), len(args), ())
        # A static argument left to its default is not passed: the function sees it.
        # Negative positions count from the end of the call's arguments (a function
        # taking *args; others had theirs resolved from the signature).
        nums = {i + len(args) if i < 0 else i for i in self.static_argnums}
        static_pos = tuple((i, args[i]) for i in sorted(nums) if 0 <= i < len(args))
        static_kw = tuple(sorted((k, kwargs[k]) for k in self.static_argnames if k in kwargs))
        for _, v in (*static_pos, *static_kw):
            if isinstance(v, RemoteArray):
                raise TypeError(
                    f"{self.name}: a RemoteArray cannot be a static argument (static arguments "
                    "are Python values fixed in the program, and its value lives on its "
                    f"slice); got {v!r}. Pass it as an ordinary argument"
                )
            try:
                hash(v)
            except TypeError:
                # ValueError, as jax.jit raises for an unhashable static argument.
                raise ValueError(
                    f"{self.name}: static arguments must be hashable (they key the program "
                    f"cache); got {type(v).__name__} {v!r}. Pass a tuple for a list, or make "
                    "it an ordinary argument"
                ) from None
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        # 2 == 2.0 == True, but each traces its own program (as in jax.jit): the types
        # are part of the key.
        types = tuple(type(v) for _, v in (*static_pos, *static_kw))
        return (dyn_args, dyn_kwargs), (static_pos, static_kw, len(args), types)

    def _joined(self, dyn: Any, static: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A call's ``(args, kwargs)`` from its dynamic and static parts (``_split``'s
        inverse)."""
        dyn_args, dyn_kwargs = dyn
        static_pos, static_kw, nargs, _ = static
        fixed, rest = dict(static_pos), iter(dyn_args)
        full = tuple(fixed[i] if i in fixed else next(rest) for i in range(nargs))
        return full, {**dyn_kwargs, **dict(static_kw)}

    def _apply(self, dyn: Any, static: Any) -> Any:
        args, kwargs = self._joined(dyn, static)
        return self.fun(*args, **kwargs)

    def _where(self, dyn: Any, static: Any, index: int) -> str:
        """Where dynamic leaf ``index`` of a call sits, in the caller's words: the
        parameter (by name where the signature has one) and the path inside it."""
        path = jax.tree_util.tree_flatten_with_path(dyn)[0][index][0]
        head, inner = path[1], jax.tree_util.keystr(path[2:])
        if isinstance(head, jax.tree_util.DictKey):
            return f"keyword argument {head.key!r}{inner}"
        static_pos, _, nargs, _ = static
        fixed = {i for i, _ in static_pos}
        position = [i for i in range(nargs) if i not in fixed][head.idx]
        params = list(self._signature.parameters.values()) if self._signature else []
        if position < len(params) and params[position].kind in (
            params[position].POSITIONAL_ONLY,
            params[position].POSITIONAL_OR_KEYWORD,
        ):
            return f"argument {params[position].name!r}{inner}"
        return f"positional argument {position}{inner}"

    def _leaf_specs(self, treedef: Any) -> list[PartitionSpec | None]:
        """``in_shardings`` broadcast to one spec (or None) per dynamic leaf."""
        n = treedef.num_leaves
        if self.in_shardings is None:
            return [None] * n
        if _is_spec_leaf(self.in_shardings):
            return [_spec_of(self.in_shardings)] * n
        dyn_args, _ = jax.tree.unflatten(treedef, [0] * n)
        given = self.in_shardings
        if not isinstance(given, tuple | list) or len(given) != len(dyn_args):
            raise ValueError(
                f"{self.name}: in_shardings must be one PartitionSpec or a tuple with one entry "
                f"per non-static positional argument ({len(dyn_args)}); got {given!r}"
            )
        out: list[PartitionSpec | None] = []
        for arg, spec in zip(dyn_args, given, strict=True):
            k = len(jax.tree.leaves(arg))
            if _is_spec_leaf(spec):
                out.extend([_spec_of(spec)] * k)
            else:
                leaves = jax.tree.leaves(spec, is_leaf=_is_spec_leaf)
                if len(leaves) != k:
                    raise ValueError(
                        f"{self.name}: in_shardings entry {spec!r} does not match its argument"
                    )
                out.extend(_spec_of(x) for x in leaves)
        out.extend([None] * (n - len(out)))  # keyword arguments: as they are
        return out

    def _donated_leaves(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
        """Flat indices (among dynamic leaves) of the donated arguments: those
        ``donate_argnums`` names, passed by position or, through the function's
        signature, by keyword (as jax.jit maps them)."""
        if not self.donates:
            return set()
        names = list(self._signature.parameters) if self._signature is not None else []
        by_name = set(self.donate_argnames)
        beyond = [
            i
            for i in self.donate_argnums
            if i >= len(args) and (i >= len(names) or names[i] not in kwargs)
        ]
        if beyond:
            raise ValueError(
                f"{self.name}: donate_argnums={self.donate_argnums} names argument {beyond[0]}, "
                f"but the call passed {len(args)} positional arguments and no keyword for it "
                "(as jax.jit refuses it)"
            )
        out: set[int] = set()
        pos = 0
        for i, a in enumerate(args):
            if i in self.static_argnums:
                continue
            n = len(jax.tree.leaves(a, is_leaf=_is_remote))
            if i in self.donate_argnums:
                out.update(range(pos, pos + n))
            pos += n
        # Keyword arguments follow, in the sorted order a dict flattens in.
        for k in sorted(k for k in kwargs if k not in self.static_argnames):
            n = len(jax.tree.leaves(kwargs[k], is_leaf=_is_remote))
            if k in by_name:
                out.update(range(pos, pos + n))
            pos += n
        return out

    def _tracing_note(self, vs: VirtualSlice, avals: Sequence[jax.ShapeDtypeStruct]) -> str:
        """Which program and inputs a JAX error came from (in a pipeline, which stage)."""
        return (
            f"while tracing pw.jit program {self.name!r} for slice {vs.name!r} with "
            f"inputs {', '.join(_aval_text(a) for a in avals) or '(none)'}"
        )


def _mesh_of(leaves: Sequence[Any]) -> Any:
    """The (abstract) mesh the first sharded input lives on, or None."""
    for x in leaves:
        sharding = getattr(jax.typeof(x), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and not getattr(mesh, "empty", True):
            return mesh
    return None


def _is_remote(x: Any) -> bool:
    return type(x) is RemoteArray


def struct_spec(x: jax.ShapeDtypeStruct) -> PartitionSpec | None:
    """The PartitionSpec a ShapeDtypeStruct was given, directly or in a NamedSharding;
    None without one. Read from what it was given: a struct made with a bare
    PartitionSpec answers ``.sharding`` only under a concrete context mesh, which a
    client has none of."""
    given = getattr(x, "_sharding", None)
    if isinstance(given, NamedSharding):
        return given.spec
    if isinstance(given, PartitionSpec) or given is None:
        return given
    raise TypeError(
        f"a jax.ShapeDtypeStruct{list(x.shape)} is given sharding {given!r}; give a "
        "PartitionSpec over the slice's mesh, a NamedSharding, or none (replicated)"
    )


def _abstract_leaf(x: Any, vs: VirtualSlice | None = None) -> Any:
    from pathways_nb.client._remote import RemoteArray

    if isinstance(x, RemoteArray):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if isinstance(x, jax.ShapeDtypeStruct):
        spec = getattr(x, "_sharding", None)
        if not isinstance(spec, PartitionSpec):
            return x
        if vs is None:
            raise ValueError(
                f"a jax.ShapeDtypeStruct{list(x.shape)} with sharding={spec} names axes of "
                "a mesh, and this function has no slice yet: pin it (pw.jit(f, slice=vs)), "
                "or give sharding=NamedSharding(vs.abstract_mesh, spec)"
            )
        vs.check_spec(spec, tuple(x.shape))
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(vs.abstract_mesh, spec), weak_type=x.weak_type
        )
    if type(x) in (int, float, complex):
        # Typed as jax.jit types a Python number, and as a call puts one: weakly.
        return jax.ShapeDtypeStruct((), jax.dtypes.canonicalize_dtype(type(x)), weak_type=True)
    arr = np.asarray(x) if not hasattr(x, "dtype") else x
    return jax.ShapeDtypeStruct(np.shape(arr), jax.dtypes.canonicalize_dtype(arr.dtype))


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    in_shardings: Any = None,
    out_shardings: Any = None,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    slice: VirtualSlice | None = None,
    name: str | None = None,
    keep_unused: bool = False,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
    device: Any = None,
    backend: Any = None,
    abstracted_axes: Any = None,
) -> Any:
    """Like ``jax.jit``, but the program runs on a virtual slice and returns RemoteArrays.

    Shardings are PartitionSpecs over the slice's mesh axes. The function runs on the
    slice its RemoteArray arguments live on, on ``slice=`` when given, or on the default
    slice (``with vs:`` or ``client.default_slice``). ``keep_unused``, ``inline`` and
    ``compiler_options`` are jax.jit's (the hosts compile with the options); ``device``,
    ``backend`` and ``abstracted_axes`` are refused: a slice places the program, and an
    exported program has fixed shapes.

    >>> @pw.jit
    ... def f(w, x):
    ...     return jnp.tanh(x @ w).sum(0)
    >>> y = f(w, x)          # returns at once
    """
    kw = dict(
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
        slice=slice,
        name=name,
        keep_unused=keep_unused,
        inline=inline,
        compiler_options=compiler_options,
        device=device,
        backend=backend,
        abstracted_axes=abstracted_axes,
    )
    if fun is None:
        return lambda f: RemoteFunction(f, **kw)
    return RemoteFunction(fun, **kw)
