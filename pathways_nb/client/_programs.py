"""How a call of a ``pw.jit`` function becomes launches: choosing the slice, moving
arguments that live on other slices, registering programs, back-pressure."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb._core import ClosedError, decode_spec, donated_twice, encode_spec
from pathways_nb.client import _graph
from pathways_nb.client._export import Program, export_program
from pathways_nb.client._indexing import Dynamic, fill_index, split_index, static_key
from pathways_nb.client._interrupts import interrupts_held
from pathways_nb.client._io import IOThread
from pathways_nb.client._jit import RemoteFunction, jit
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._slice import VirtualSlice
from pathways_nb.client._tracectx import output_checks, trace_context
from pathways_nb.wire import interrupts_deferred

if TYPE_CHECKING:
    from pathways_nb._core import HandleAllocator
    from pathways_nb.client._session import Client


class Pinnable(Protocol):
    """A function a client runs on a slice: its name, and the slice it is pinned to."""

    name: str
    slice: VirtualSlice | None


_MAX_OPS = 512
# jax.Array attributes that are values, not methods.
_PROPERTIES = frozenset({"T", "mT", "real", "imag"})


class ProgramCalls:
    """The part of :class:`Client` that turns calls into launches."""

    _ids: HandleAllocator
    _io: IOThread
    _cond: threading.Condition
    _pending: dict[int, list[int]]
    _programs_sent: set[str]
    _ops: collections.OrderedDict[Any, RemoteFunction]
    default_slice: VirtualSlice | None
    max_queued: int

    if TYPE_CHECKING:  # provided by Client

        @property
        def closed(self) -> bool: ...

        def _check_open(self) -> None: ...

        def _ask(self, header: dict[str, Any], timeout: float | None = 60.0) -> dict[str, Any]: ...

        def _put(self, vs: VirtualSlice, value: Any, spec: PartitionSpec | None) -> RemoteArray: ...

        def cancel(self) -> int: ...

    def _call(self, f: RemoteFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if f.slice is not None and f.slice._client is self and self.closed:
            raise ClosedError(
                f"pw.jit function {f.name} is pinned to slice {f.slice.name!r} of a client "
                "that was closed; pin it to a slice of a client that is open: "
                "pw.jit(f, slice=vs) with vs from the new client's allocate"
            )
        self._check_open()
        rec = _graph.active()
        dyn, static = f._split(args, kwargs)
        # RemoteArray is not a pytree node, so it is a leaf without an is_leaf callback.
        leaves, treedef = jax.tree.flatten(dyn)
        vs = self._choose_slice(f, leaves)
        arrays: list[RemoteArray] = leaves
        for leaf in leaves:
            if type(leaf) is not RemoteArray or leaf.slice is not vs or leaf._epoch != vs.epoch:
                in_specs = f._leaf_specs(treedef)
                arrays = []
                for i, (x, s) in enumerate(zip(leaves, in_specs, strict=True)):
                    try:
                        arrays.append(self._onto(vs, x, s, rec))
                    except TypeError as exc:
                        # What put says of a value, said of the call's argument it came from.
                        raise TypeError(
                            f"{f.name}: {f._where(dyn, static, i)} ({type(x).__name__}) "
                            f"cannot be passed to the program: {exc}. Pass arrays or numbers "
                            "there, or mark the argument static (static_argnums / "
                            "static_argnames) to fix its value in the program"
                        ) from None
                break
            if leaf._deleted:
                leaf._check_usable()
        donate = tuple(sorted(f._donated_leaves(args, kwargs))) if f.donates else ()
        if donate:
            _check_donation(f.name, arrays, donate)
        key = program_key(treedef, tuple([a._sig for a in arrays]), static, vs, donate)
        prog = f._programs.get(key)
        if prog is None:
            avals = [
                jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding, weak_type=a.weak_type)
                for a in arrays
            ]
            with interrupts_held():
                prog = export_program(f, vs, treedef, avals, static, donate)
            if rec is not None and rec.tracing:
                return self._trace_only(f.name, prog, vs, arrays, rec)  # not sent, not cached
            self._register(prog, vs)
            f._programs[key] = prog
        elif prog.pid not in self._programs_sent:
            # Traced for another client (of this cluster or one before it): this one's
            # controller has not got it.
            self._register(prog, vs)
        if rec is None:
            return self._launch(prog, vs, arrays)
        return self._launch_recorded(f.name, prog, vs, arrays, rec)

    def _launch_recorded(
        self,
        name: str,
        prog: Program,
        vs: VirtualSlice,
        arrays: list[RemoteArray],
        rec: _graph.Recorder | None,
    ) -> Any:
        """Launch ``prog``, noting it in the graph being recorded, if any (or, while a
        graph is traced from shapes, only what it would return)."""
        if rec is None:
            return self._launch(prog, vs, arrays)
        if rec.tracing:
            return self._trace_only(name, prog, vs, arrays, rec)
        out = self._launch(prog, vs, arrays)
        leaves_out = jax.tree.leaves(out, is_leaf=lambda v: isinstance(v, RemoteArray))
        rec.program(name, vs, arrays, leaves_out, leaves_out[0]._lid if leaves_out else 0)
        return out

    def _trace_only(
        self,
        name: str,
        prog: Program,
        vs: VirtualSlice,
        arrays: list[RemoteArray],
        rec: _graph.Recorder,
    ) -> Any:
        """What a launch would return, for pw.graph: placeholders with shapes, no launch."""
        outs = [
            _graph.GraphArray(
                self._as_client(),
                aval.shape,
                aval.dtype,
                NamedSharding(vs.abstract_mesh, spec or PartitionSpec()),
                vs,
            )
            for aval, spec in zip(prog.out_avals, prog.out_specs, strict=True)
        ]
        rec.program(name, vs, arrays, outs)
        return prog.unflatten(outs)

    def _choose_slice(
        self, f: Pinnable, leaves: list[Any], pin: str = "pw.jit(..., slice=...)"
    ) -> VirtualSlice:
        if f.slice is None and leaves and type(leaves[0]) is RemoteArray:
            # The common case: every argument a RemoteArray on one active slice.
            vs = leaves[0].slice
            if vs.state == "active" and all(
                type(x) is RemoteArray and x.slice is vs for x in leaves
            ):
                return vs
        on = {x.slice.id: x.slice for x in leaves if isinstance(x, RemoteArray)}
        if f.slice is not None:
            # A pinned function is the MPMD path: arguments on other slices move to it.
            vs = f.slice
        elif len(on) > 1:
            names = sorted(s.name for s in on.values())
            raise ValueError(
                f"{f.name}: arguments live on different slices {names}; a program runs on one "
                f"slice. Pin the function with {pin} to move them there."
            )
        elif on:
            vs = next(iter(on.values()))
        elif self.default_slice is not None:
            vs = self.default_slice
        else:
            raise ValueError(
                f"{f.name}: no slice to run on. Pass RemoteArrays, pin it with "
                f"{pin.replace('...', 'vs')}, or set a default with `with vs:`."
            )
        if vs.state == "lost" and any(type(x) is RemoteArray and x.slice is vs for x in leaves):
            vs.check_active()  # its inputs went with the host: no remap brings them back
        vs._ready_for_work()
        return vs

    def _onto(
        self,
        vs: VirtualSlice,
        x: Any,
        spec: PartitionSpec | None,
        rec: _graph.Recorder | None = None,
    ) -> RemoteArray:
        """``x`` as a RemoteArray on ``vs``: put if it is local, moved if it lives elsewhere."""
        if not isinstance(x, RemoteArray):
            # A Python number comes back weakly typed, as jax.jit traces one.
            return self._put(vs, x, spec or PartitionSpec())
        x._check_usable()
        if x.slice is vs:
            return x
        self._check_movable(x)
        spec = _moved_spec(x, vs, spec)
        if rec is not None and rec.tracing:
            return rec.move(x, vs, spec)
        copy = self._move(x, vs, spec)
        if rec is not None:
            rec.moved(x, copy, copy._lid)
        return copy

    def _check_movable(self, x: RemoteArray) -> None:
        """Raise unless ``x`` (usable) can leave its slice for another of this client's:
        its slice is live and it is this client's array."""
        if x._client.closed:
            raise ClosedError(
                f"{x!r} belongs to a client that was closed, and went with it; put its value "
                "through an open client (pw.Client) to use it there"
            )
        if x.slice.state == "released":
            raise ClosedError(
                f"{x!r} lives on slice {x.slice.name!r}, which was released: its arrays went "
                "with it. Release a slice once what it holds has been used or fetched"
            )
        x.slice.check_active()  # a lost slice's arrays are lost with it
        if x._client is not self:
            raise ValueError(
                f"{x!r} lives on slice {x.slice.name!r} of another pw.Client (tenant "
                f"{x._client.tenant}); a client's programs and slices take only its own "
                "arrays. Fetch it there and put its value on this client's slice."
            )

    def _move(
        self, x: RemoteArray, vs: VirtualSlice, spec: PartitionSpec | None, cached: bool = True
    ) -> RemoteArray:
        """A copy of ``x`` on slice ``vs``, sent host to host; it is made once per
        (slice, sharding) and lives as long as ``x`` (``cached=False``: a new one, for an
        explicit put, which its caller owns).

        Without a sharding from the consumer, the copy keeps ``x``'s PartitionSpec where
        the destination mesh has those axes and is replicated otherwise.
        """
        vs._ready_for_work()
        spec = _moved_spec(x, vs, spec)
        key = (vs.id, spec)
        copies = x._copies
        if copies is not None and cached:
            done = copies.get(key)
            if done is not None and not done._deleted and done._epoch == vs.epoch:
                return done  # a copy made before vs was remapped went with its host
        out = self._transfer(x, vs, spec, tuple(x.shape), {})
        if cached:
            if copies is None:
                copies = x._copies = {}
            copies[key] = out
        return out

    def _transfer(
        self,
        x: RemoteArray,
        vs: VirtualSlice,
        spec: PartitionSpec,
        shape: tuple[int, ...],
        extra: dict[str, Any],
    ) -> RemoteArray:
        """Send the transfer of ``x`` onto ``vs`` (its header's fields beyond the
        usual in ``extra``); the copy it makes, of ``shape``."""
        self._backpressure()
        lid = self._ids.next()
        dst = self._ids.next()
        with interrupts_deferred():  # pending, sent and made, or none of them
            self._pending[lid] = [dst]
            self._deletions_first(vs)
            self._io.send_batched(
                {
                    "t": "transfer",
                    "lid": lid,
                    "src": x.handle,
                    "dst": dst,
                    "slice": vs.id,
                    "shape": list(shape),
                    "dtype": str(x.dtype),
                    "spec": encode_spec(spec),
                }
                | extra
            )
            sharding = NamedSharding(vs.abstract_mesh, spec)
            return RemoteArray(self._as_client(), dst, shape, x.dtype, sharding, vs, lid)

    def _move_hlo(
        self,
        x: RemoteArray,
        vs: VirtualSlice,
        op_sharding: bytes,
        positions: list[int],
        shard: tuple[int, tuple[int, ...]] | None = None,
    ) -> RemoteArray:
        """A copy of ``x`` on ``vs`` laid out as XLA's ``OpSharding`` (serialized) says
        over its devices at ``positions``, sent host to host (on x's own host, host to
        itself): how plain JAX's arrays move and reshard through the IFRT proxy. With
        ``shard`` (a position in x's device order, and that buffer's shape), the copy is
        of that one device's buffer, as IFRT takes an array apart. As for
        :meth:`_put_hlo`, the RemoteArray's own sharding says nothing of that layout."""
        shape = tuple(x.shape) if shard is None else tuple(shard[1])
        self._check_movable(x)
        vs._ready_for_work()
        extra: dict[str, Any] = {"hlo_sharding": {"op": op_sharding, "positions": list(positions)}}
        if shard is not None:
            extra["shard"] = shard[0]
        return self._transfer(x, vs, PartitionSpec(), shape, extra)

    def _register(self, prog: Program, vs: VirtualSlice) -> None:
        if prog.pid not in self._programs_sent:
            header = {
                "t": "program",
                "pid": prog.pid,
                "key": prog.key,
                "name": prog.name,
                "nin": prog.nin,
                "nout": len(prog.out_avals),
                "in_specs": prog.in_specs,
            }
            if prog.compiler_options:
                header["options"] = prog.compiler_options
            if prog.axis_types:
                header["axis_types"] = prog.axis_types
            if prog.kind != "xla":
                header["kind"] = prog.kind
            self._io.send(header, [prog.blob])
            self._programs_sent.add(prog.pid)
        if any(s is None for s in prog.out_specs):
            # The compiler picks these layouts; ask the host once, as jax.jit's first call
            # compiles before it returns.
            # Compiled with the launches' donations: the executable they will run.
            probe = {"t": "probe", "slice": vs.id, "pid": prog.pid, "donate": list(prog.donate)}
            h = self._ask(probe, timeout=None)
            prog.out_specs = [
                decode_spec(s) if s is not None else PartitionSpec() for s in h["out_specs"]
            ]

    def _deletions_first(self, vs: VirtualSlice) -> None:
        """Under a store limit or quota on ``vs``'s host, what a launch or transfer makes
        there may fit only once the arrays deleted before it are gone: those deletions go
        first (else they leave on the IO thread's next turn, or with a later launch)."""
        if vs._bounded and self._io.deletes_waiting:
            self._io.deletes_now()

    def _launch(self, prog: Program, vs: VirtualSlice, arrays: list[RemoteArray]) -> Any:
        self._backpressure()
        lid = self._ids.next()
        outs = [self._ids.next() for _ in prog.out_avals]
        if prog.out_shardings is None:
            prog.out_shardings = [
                NamedSharding(vs.abstract_mesh, spec or PartitionSpec()) for spec in prog.out_specs
            ]
        # Pending, sent, donations marked and outputs made, or none of them: a Ctrl-C
        # between would leave a launch waited for that never left, or one that ran
        # with no array to delete its outputs.
        with interrupts_deferred():
            self._pending[lid] = outs  # a dict store is atomic; the IO thread pops under lock
            self._deletions_first(vs)
            launch = {
                "t": "launch",
                "lid": lid,
                "slice": vs.id,
                "pid": prog.pid,
                "ins": [a.handle for a in arrays],
                "outs": outs,
                "donate": list(prog.donate),
            }
            if check := output_checks():
                launch["check"] = check
            self._io.send_batched(launch)
            for i in prog.donate:
                arrays[i]._deleted = True
            results = [
                RemoteArray(self._as_client(), h, aval.shape, aval.dtype, sharding, vs, lid)
                for h, aval, sharding in zip(outs, prog.out_avals, prog.out_shardings, strict=True)
            ]
            for i in prog.weak_outputs:
                results[i]._mark_weak()
        return prog.unflatten(results)

    def _as_client(self) -> Client:
        return self  # type: ignore[return-value]

    def _backpressure(self) -> None:
        if len(self._pending) < self.max_queued:
            return
        try:
            with self._cond:
                while len(self._pending) >= self.max_queued:
                    self._check_open()
                    self._cond.wait(0.1)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def _op(self, key: str, fn: Any, *args: Any) -> Any:
        """A small program on the first RemoteArray's slice (arithmetic, indexing)."""
        x = next(a for a in args if isinstance(a, RemoteArray))
        if self.closed:
            raise ClosedError(
                f"{x!r} belongs to a client that was closed, and went with it; put its value "
                "through an open client (pw.Client) to use it there"
            )
        if any(isinstance(a, jax.core.Tracer) for a in args):
            raise TypeError(
                f"{x!r} is used inside a traced function (pw.jit, jax.jit, jax.grad, ...) "
                "that does not take it as an argument. A RemoteArray's value lives on its "
                "slice, so the function must receive it: pass it as an argument, or fetch it "
                "first (np.asarray(x)) to use its value as a constant"
            )
        # Python scalars become constants of the program (one program per value), so
        # `x * 0.5` in a loop sends no array; arrays travel as arguments.
        consts = tuple(
            (i, type(a).__name__, a)
            for i, a in enumerate(args)
            if isinstance(a, int | float | bool)
        )
        # 0.0 == -0.0 (and NaN is not NaN): floats key their programs by their bits.
        k = (
            key,
            x.slice.id,
            tuple((i, t, a.hex() if isinstance(a, float) else a) for i, t, a in consts),
        )
        f = self._ops.get(k)
        if f is not None:
            self._ops.move_to_end(k)
        else:
            fixed = {i: a for i, _, a in consts}

            def bound(*dyn: Any) -> Any:
                it = iter(dyn)
                full = [fixed[i] if i in fixed else next(it) for i in range(len(args))]
                return fn(*full)

            f = jit(bound, slice=x.slice, name=key)
            self._ops[k] = f
            if len(self._ops) > _MAX_OPS:
                # `x * i` over many values of i must not keep every program forever.
                self._ops.popitem(last=False)
        return f(*(a for a in args if not isinstance(a, int | float | bool)))

    def _index(self, x: RemoteArray, index: Any) -> RemoteArray:
        key, fixed, arrays = split_index(index, x.shape)
        return self._op(f"getitem[{key}]", lambda a, *dyn: a[fill_index(fixed, dyn)], x, *arrays)

    def _method(
        self,
        x: RemoteArray,
        name: str,
        at: tuple[Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``x.name(*args, **kwargs)`` (``x.at[index].name(...)`` when ``at`` is the
        1-tuple ``(index,)``: an index may itself be None) as a small program on x's
        slice. Arrays among the arguments (RemoteArrays, NumPy arrays) are its arguments;
        everything else is fixed in the program."""
        key, fixed_at, found = split_index(at[0], x.shape) if at is not None else ("", None, [])
        arrays: list[Any] = list(found)

        def place(v: Any) -> Any:
            if isinstance(v, RemoteArray) or (
                isinstance(v, np.ndarray | jax.Array) and np.ndim(v) > 0
            ):
                arrays.append(v)
                return Dynamic(len(arrays) - 1)
            if type(v) in (list, tuple):  # a sequence of arrays, as choose's choices
                return type(v)(place(e) for e in v)
            return v

        def shown_key(v: Any) -> str:
            if isinstance(v, Dynamic):
                return f"arg{v.position}"
            if type(v) in (list, tuple):  # as static_key writes them
                inner = ",".join(shown_key(e) for e in v)
                return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
            return static_key(v)

        fixed_args = [place(a) for a in args]
        fixed_kwargs = {k: place(v) for k, v in kwargs.items()}
        try:
            shown = [shown_key(a) for a in fixed_args] + [
                f"{k}={shown_key(v)}" for k, v in sorted(fixed_kwargs.items())
            ]
        except TypeError as exc:
            raise TypeError(f"RemoteArray.{name}: {exc}") from None

        def fn(a: Any, *dyn: Any) -> Any:
            def fill(v: Any) -> Any:
                if isinstance(v, Dynamic):
                    return dyn[v.position]
                if type(v) in (list, tuple):
                    return type(v)(fill(e) for e in v)
                return v

            full = [fill(v) for v in fixed_args]
            named = {k: fill(v) for k, v in fixed_kwargs.items()}
            if at is not None:
                return getattr(a.at[fill_index(fixed_at, dyn)], name)(*full, **named)
            if name in _PROPERTIES:
                return getattr(a, name)
            return getattr(a, name)(*full, **named)

        where = f"at[{key}]." if at is not None else ""
        call = "" if name in _PROPERTIES else f"({','.join(shown)})"
        return self._op(f"{where}{name}{call}", fn, x, *arrays)


def program_key(
    treedef: Any, sigs: tuple[Any, ...], static: Any, vs: VirtualSlice, donate: tuple[int, ...]
) -> tuple[Any, ...]:
    """What a pw.jit function's program cache keys on: the inputs' tree and signatures
    (shape, dtype, spec, weak type), static arguments, slice shape, donations, and the
    JAX settings the trace depends on."""
    return (treedef, sigs, static, vs.signature, donate, trace_context())


def _moved_spec(x: RemoteArray, vs: VirtualSlice, spec: PartitionSpec | None) -> PartitionSpec:
    """The sharding of ``x``'s copy on ``vs``: the consumer's if given, else ``x``'s own
    where ``vs`` has those axes, else replicated."""
    if spec is not None:
        vs.check_spec(spec, x.shape)
        return spec
    try:
        vs.check_spec(x.spec, x.shape)
    except ValueError:
        return PartitionSpec()
    return x.spec


def _check_donation(name: str, arrays: Sequence[RemoteArray], donate: Sequence[int]) -> None:
    """Refuse an array that is donated and passed again in the same call: the program
    may overwrite a donated buffer, so it cannot also be read as another input (XLA
    refuses it, and with CPU devices ends the host's process)."""
    twice = donated_twice([a.handle for a in arrays], donate)
    if twice is not None:
        i, count = twice
        raise ValueError(
            f"{name}: the same array {arrays[i]!r} is passed {count} times and donated "
            "(donate_argnums): a donated buffer is the program's to overwrite, so it "
            "cannot also be read as another argument. Pass a copy for one of them "
            "(x.copy()), or do not donate it"
        )
