"""A pw.jit function exported for a slice: the traced program, its outputs' layouts, and
what the hosts need to compile and run it."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import jax
import numpy as np
from jax import export
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from pathways_nb._core import PathwaysError, encode_spec, program_id
from pathways_nb.client._slice import VirtualSlice

if TYPE_CHECKING:
    from pathways_nb.client._jit import RemoteFunction

# The signature of the flat function a program is traced from: its leaves, positionally.
_LEAVES = inspect.Signature([inspect.Parameter("leaves", inspect.Parameter.VAR_POSITIONAL)])


_SWAP = threading.Lock()


@contextlib.contextmanager
def _local_backend() -> Iterator[None]:
    """JAX's default backend as this process's CPU one while a program is exported.
    Under ``pw.use_jax`` the default is the IFRT proxy's client, which cannot
    serialize programs (``jax.export`` asks the default backend how)."""
    from jax._src import xla_bridge as xb

    default = xb._default_backend
    local = xb._backends.get("cpu")
    if default is None or local is None or hasattr(default, "serialize_with_sdy"):
        yield
        return
    with _SWAP:
        xb._default_backend = local
        xb.get_backend.cache_clear()
        try:
            yield
        finally:
            xb._default_backend = default
            xb.get_backend.cache_clear()


class TraceError(PathwaysError, ValueError):
    """The function cannot become a pathways program (for example a host callback)."""


@dataclasses.dataclass
class Program:
    """A traced, exported program for one signature on one mesh shape."""

    pid: str
    name: str
    blob: bytes
    key: bytes  # with the blob, what the pid is the digest of (see program_id)
    nin: int
    out_tree: Any
    out_avals: list[Any]
    out_specs: list[PartitionSpec | None]
    donate: tuple[int, ...]
    platform: str
    # Encoded PartitionSpec of each input: hosts need them for inputs the exported
    # program leaves unconstrained (it does not use them).
    in_specs: list[Any] = dataclasses.field(default_factory=list)
    # Filled on first launch: the NamedShardings of the outputs, reused by every launch.
    out_shardings: list[NamedSharding] | None = None
    # The outputs JAX types weakly (``int_array * 0.5``), as jax.jit's results are.
    weak_outputs: tuple[int, ...] = ()
    # float0 leaves of the output (the gradient of an integer input), by position among
    # all of them, with their shapes: they carry no values, so the exported program
    # leaves them out and the client puts NumPy float0 arrays in their places, as
    # jax.jit returns them.
    float0_outputs: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # XLA options its hosts compile it with (jax.jit's compiler_options).
    compiler_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The mesh axes' types it was traced with, by name, where any is not Auto: hosts
    # compile it for a mesh of the same types.
    axis_types: list[str] = dataclasses.field(default_factory=list)
    # "xla" for a jax.export artifact; "python" for a pickled function (pw.colocated).
    kind: str = "xla"

    @property
    def single_output(self) -> bool:
        return self.out_tree.num_leaves == 1 and self.out_tree.num_nodes == 1

    def unflatten(self, exported: list[Any]) -> Any:
        """The function's output from the exported program's outputs."""
        full = list(exported)
        for i, shape in self.float0_outputs:
            full.insert(i, np.zeros(shape, jax.dtypes.float0))
        if self.single_output:
            return full[0]
        return jax.tree.unflatten(self.out_tree, full)


def export_program(
    self: RemoteFunction,
    vs: VirtualSlice,
    treedef: Any,
    avals: list[jax.ShapeDtypeStruct],
    static: Any,
    donate: tuple[int, ...],
) -> Program:
    """``self`` exported for these abstract inputs on ``vs``'s mesh: what a launch runs."""
    am = vs.abstract_mesh
    user_out = self.out_shardings
    out_holder: list[Any] = []
    float0_holder: list[tuple[tuple[int, tuple[int, ...]], ...]] = []
    in_specs = self._leaf_specs(treedef)
    for i, a in enumerate(avals):
        if (
            not jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
            and jax.dtypes.canonicalize_dtype(a.dtype) != a.dtype
        ):
            raise TypeError(
                _NOT_CANONICAL.format(
                    name=self.name,
                    i=i,
                    a=_aval_text(a),
                    to=np.dtype(jax.dtypes.canonicalize_dtype(a.dtype)).name,
                )
            )
    for what, given in (("in_shardings", in_specs), ("out_shardings", [user_out])):
        for spec in jax.tree.leaves(given, is_leaf=_is_spec_leaf):
            if isinstance(spec, PartitionSpec):
                try:
                    vs.check_axes(spec)
                except ValueError as exc:
                    raise ValueError(f"{self.name}: {what}: {exc}") from None
    # jax.jit refuses an in_sharding that does not split its argument evenly; the
    # resharding below would pad it instead, so refuse it here as JAX does.
    _check_specs(self.name, vs, "in_shardings for input", avals, in_specs)

    def flat(*leaves: Any) -> list[Any]:
        xs = list(leaves)
        for i, spec in enumerate(in_specs):
            # A RemoteArray keeps its own layout on the wire; a different requested
            # in_sharding becomes a resharding inside the program (jax.jit refuses a
            # committed argument laid out otherwise; here arrays from other slices
            # arrive resharded, and one on the slice itself is treated alike).
            if spec is not None and xs[i].ndim and spec != avals[i].sharding.spec:
                xs[i] = laid_out(xs[i], NamedSharding(am, spec))
        # The slice's mesh is the context mesh while the function traces, as under
        # jax.set_mesh: bare PartitionSpecs work in with_sharding_constraint,
        # shard_map and reshard inside it.
        with jax.sharding.use_abstract_mesh(am):
            out = self._apply(jax.tree.unflatten(treedef, xs), static)
        flat_out, out_tree = jax.tree.flatten(out)
        out_holder.append(out_tree)
        zeros = tuple((i, tuple(x.shape)) for i, x in enumerate(flat_out) if _is_float0(x))
        float0_holder.append(zeros)
        return [x for x in flat_out if not _is_float0(x)] if zeros else flat_out

    # JAX's trace errors name the user's function and its source line, not this
    # wrapper's; its arguments keep this wrapper's signature, the flat leaves.
    flat.__wrapped__ = self.fun  # type: ignore[attr-defined]
    flat.__signature__ = _LEAVES  # type: ignore[attr-defined]

    in_sh = [a.sharding for a in avals]

    def exported(out_sh: Any) -> export.Exported:
        jitted = jax.jit(
            flat,
            in_shardings=in_sh,
            out_shardings=out_sh,
            donate_argnums=donate,
            keep_unused=self.keep_unused,
        )
        with _local_backend():
            return export.export(jitted, platforms=(vs.platform,))(*avals)

    try:
        out_sh: Any = None
        if user_out is not None:
            shapes = jax.eval_shape(flat, *avals)  # learn the output tree
            wanted = _broadcast_specs(user_out, out_holder[-1])
            dropped = {i for i, _ in float0_holder[-1]}
            wanted = [s for i, s in enumerate(wanted) if i not in dropped]
            _check_specs(self.name, vs, "out_shardings for output", shapes, wanted)
            if any(s is not None for s in wanted):
                out_sh = [None if s is None else NamedSharding(am, s) for s in wanted]
        exp = exported(out_sh)
        if exp.nr_devices != vs.size and out_sh is None:
            # Nothing ties the program to the slice's devices (it ignores its inputs
            # and leaves its outputs' layout free), so it was exported for one device:
            # make its outputs replicated over the slice instead.
            jax.eval_shape(flat, *avals)
            kept = out_holder[-1].num_leaves - len(float0_holder[-1])
            exp = exported([NamedSharding(am, PartitionSpec())] * kept)
        blob = bytes(exp.serialize())
    except NotImplementedError as exc:
        if "host_callback" in str(exc):
            raise TraceError(_CALLBACK.format(name=self.name)) from None
        raise
    except ValueError as exc:
        # What JAX says of a callback lowered for an abstract mesh (pure_callback,
        # io_callback): it would need this process's devices.
        if "require devices to be present during lowering" in str(exc):
            raise TraceError(_CALLBACK.format(name=self.name) + f" (JAX: {exc})") from None
        exc.add_note(self._tracing_note(vs, avals))
        raise
    except Exception as exc:
        # JAX's own error, kept as it is, with which program and inputs it came from
        # (in a pipeline, which stage).
        exc.add_note(self._tracing_note(vs, avals))
        raise
    out_specs: list[PartitionSpec | None] = []
    known = exp.out_shardings_jax(am)
    for aval, s in zip(exp.out_avals, known, strict=True):
        if isinstance(s, NamedSharding):
            out_specs.append(s.spec)
        elif aval.ndim == 0:
            out_specs.append(PartitionSpec())
        else:
            out_specs.append(None)
    in_wire = [encode_spec(a.sharding.spec) for a in avals]
    types = [t.name for t in am.axis_types]
    axis_types = types if any(t != "Auto" for t in types) else []
    # The name is part of the identity: the event log names what ran by its program.
    key = repr((donate, in_wire, self.name)).encode()
    return Program(
        pid=program_id(blob, key, self.compiler_options, axis_types),
        name=self.name,
        blob=blob,
        key=key,
        nin=len(avals),
        out_tree=out_holder[-1],
        out_avals=list(exp.out_avals),
        out_specs=out_specs,
        donate=donate,
        platform=vs.platform,
        in_specs=in_wire,
        weak_outputs=tuple(i for i, a in enumerate(exp.out_avals) if a.weak_type),
        float0_outputs=float0_holder[-1],
        compiler_options=self.compiler_options,
        axis_types=axis_types,
    )


_NOT_CANONICAL = (
    "{name}: input {i} is {a}, made while jax_enable_x64 was on; with it off now, JAX has "
    "no such type. Turn it on again (jax.config.update('jax_enable_x64', True)) to use "
    "the array, or convert it while it is on: with jax.enable_x64(True): "
    "x = x.astype(np.{to})"
)


def _check_specs(
    name: str, vs: VirtualSlice, what: str, avals: Sequence[Any], specs: Sequence[Any]
) -> None:
    """Refuse a PartitionSpec that does not split its array evenly over ``vs``, before
    JAX says so of an abstract mesh (or a resharding pads it)."""
    for i, (a, spec) in enumerate(zip(avals, specs, strict=True)):
        if isinstance(spec, PartitionSpec) and a.ndim:
            try:
                vs.check_spec(spec, tuple(a.shape))
            except ValueError as exc:
                raise ValueError(f"{name}: {what} {i} ({_aval_text(a)}): {exc}") from None


_CALLBACK = (
    "{name} uses a host callback (jax.debug.print, jax.pure_callback, io_callback, ...). "
    "Programs run on remote hosts as jax.export artifacts, which cannot carry callbacks: "
    "remove the callback, or return the value and print it after fetching, or run the "
    "Python part on the host between programs with pw.colocated(fn, out=...)."
)


def _is_float0(x: Any) -> bool:
    # What is not an array at all is left for JAX to name.
    return getattr(x, "dtype", None) == jax.dtypes.float0


def _broadcast_specs(prefix: Any, out_tree: Any) -> list[PartitionSpec | None]:
    """One PartitionSpec per output leaf from ``out_shardings`` given as a tree prefix;
    None where it says None, which leaves that output's layout to the compiler, as in
    ``jax.jit``."""
    specs, prefix_def = jax.tree.flatten(prefix, is_leaf=_is_spec_leaf)
    full = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    try:
        subtrees = cast(Any, prefix_def).flatten_up_to(full)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"out_shardings {prefix!r} does not match the structure of the outputs: {exc}"
        ) from None
    out: list[PartitionSpec | None] = []
    for spec, sub in zip(specs, subtrees, strict=True):
        out.extend([_spec_of(spec)] * len(jax.tree.leaves(sub)))
    return out


def _aval_text(a: jax.ShapeDtypeStruct) -> str:
    return f"{getattr(a.dtype, 'name', a.dtype)}{list(a.shape)}"


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec | NamedSharding)


def _spec_of(sharding: Any) -> PartitionSpec | None:
    if sharding is None:
        return None
    if isinstance(sharding, PartitionSpec):
        return sharding
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    raise TypeError(
        f"shardings for pw.jit are PartitionSpecs over the slice's mesh axes (or None); "
        f"got {type(sharding).__name__}"
    )


def laid_out(x: Any, sharding: NamedSharding) -> Any:
    """``x`` with this layout inside a traced function: a sharding constraint, or on a
    mesh with Explicit axes (where a constraint only asserts the layout it already has,
    and fails otherwise) a reshard, as JAX asks there."""
    if any(t == AxisType.Explicit for t in sharding.mesh.axis_types):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)
