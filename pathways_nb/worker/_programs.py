"""The programs a host knows and their executables: deserialize once, compile once per
(program, device assignment, donation) while it stays among the most recently used."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax import export
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pathways_nb._core import RemoteError, decode_spec, encode_spec
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._hlo import HloProgram
from pathways_nb.worker._python import Colocated
from pathways_nb.worker._python import load as load_python
from pathways_nb.worker._threads import as_host

log = logging.getLogger("pathways_nb.worker")


@dataclasses.dataclass
class Program:
    name: str
    # The jax.export artifact; None for a client's Python function (pw.colocated) and
    # for StableHLO compiled with its own options (kind "hlo", from the IFRT proxy).
    exported: export.Exported | None
    # The client's encoded PartitionSpec per input, for inputs the export leaves free.
    in_specs: list[Any] = dataclasses.field(default_factory=list)
    # Bytes of each output (0 for extended dtypes such as PRNG keys), for the store.
    out_nbytes: list[int] = dataclasses.field(default_factory=list)
    total_nbytes: int = 0
    # XLA options to compile it with (jax.jit's compiler_options), from the client.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The mesh axis types it was traced with (AxisType names; none: all Auto).
    axis_types: list[str] = dataclasses.field(default_factory=list)
    python: Colocated | None = None
    hlo: HloProgram | None = None

    def __post_init__(self) -> None:
        if self.python is not None:
            self.out_nbytes = list(self.python.out_nbytes)
        elif self.hlo is not None:
            self.out_nbytes = list(self.hlo.out_nbytes)
        elif self.exported is not None:
            self.out_nbytes = [
                0
                if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
                else math.prod(a.shape) * np.dtype(a.dtype).itemsize
                for a in self.exported.out_avals
            ]
        self.total_nbytes = sum(self.out_nbytes)


class Programs:
    """The host's programs, meshes and compiled executables.

    The dispatch thread launches them; programs are deserialized, and probes compiled
    and answered, on a thread of their own (:meth:`add_soon`, :meth:`probe_soon`), so a
    client's first call of a new function, which waits for the probe as ``jax.jit``'s
    first call waits for its compile, does not also wait behind the island's running
    work (a long colocated function, a queue of launches). The socket thread asks only
    for meshes. A compile is done once, by whichever thread asks first."""

    def __init__(
        self,
        host: str,
        devices: Sequence[jax.Device],
        max_executables: int = 256,
        colocated_python: bool = True,
    ) -> None:
        self.host = host
        # Whether clients' Python functions (pw.colocated) run here.
        self.colocated_python = colocated_python
        self._devices = {int(d.id): d for d in devices}
        self._programs: dict[str, Program] = {}
        self._bad_programs: dict[str, RemoteError] = {}
        # Least recently used first; beyond max_executables the oldest is dropped (its
        # program stays, and compiles again if launched).
        self._executables: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
        self.max_executables = max_executables
        self._meshes: dict[tuple[Any, ...], Mesh] = {}
        self._lock = threading.Lock()
        self._compiling: dict[tuple[Any, ...], concurrent.futures.Future[Any]] = {}
        self._side: concurrent.futures.ThreadPoolExecutor | None = None
        self.compiles = 0
        # Called after each compile: XLA starts its compiler threads on the first one.
        self.after_compile: Callable[[], object] | None = None

    @property
    def count(self) -> int:
        return len(self._programs)

    @property
    def executables(self) -> int:
        return len(self._executables)

    def get(self, pid: str) -> Program | None:
        return self._programs.get(pid)

    def name(self, pid: str) -> str:
        prog = self._programs.get(pid)
        return prog.name if prog is not None else pid

    def add_soon(self, *args: Any) -> concurrent.futures.Future[None]:
        """:meth:`add` on the programs' own thread; the dispatch thread waits for it where
        the program's message sits among the island's work, so launches after it find it."""
        return self._on_side(functools.partial(self.add, *args))

    def probe_soon(self, h: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
        """Answer the probe ``h`` with ``send`` from the programs' own thread, after the
        programs that came before it are added."""
        self._on_side(lambda: send(self.probe_reply(h)))

    def _on_side(self, fn: Callable[[], None]) -> concurrent.futures.Future[None]:
        with self._lock:
            if self._side is None:
                self._side = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"pw-programs-{self.host}"
                )
            return self._side.submit(as_host(fn))

    def close(self) -> None:
        """Stop the programs' thread once what it was given is done; safe twice."""
        with self._lock:
            side, self._side = self._side, None
        if side is not None:
            side.shutdown(wait=True)

    def add(
        self,
        pid: str,
        name: str,
        blob: bytes,
        in_specs: Sequence[Any] = (),
        options: dict[str, Any] | None = None,
        axis_types: Sequence[str] = (),
        kind: str = "xla",
    ) -> None:
        """Deserialize a program sent by the controller (once per id)."""
        if pid in self._programs:
            return
        if kind == "python":
            try:
                colocated = load_python(name, blob, self.colocated_python)
            except RemoteError as exc:
                log.warning("program %s (%s): %s", name, pid, exc)
                self._bad_programs[pid] = to_remote(
                    exc, "invalid", program=name, slice="", host=self.host
                )
                return
            self._programs[pid] = Program(name, None, in_specs=list(in_specs), python=colocated)
            return
        if kind == "hlo":
            try:
                hlo = HloProgram(name, blob)
            except RemoteError as exc:
                log.warning("program %s (%s): %s", name, pid, exc)
                self._bad_programs[pid] = to_remote(
                    exc, "invalid", program=name, slice="", host=self.host
                )
                return
            self._programs[pid] = Program(name, None, hlo=hlo)
            return
        try:
            exp = export.deserialize(bytearray(blob))
        except Exception as exc:  # a corrupt artifact is the client's problem, not ours
            log.warning("program %s (%s) did not deserialize: %s", name, pid, exc)
            self._bad_programs[pid] = to_remote(
                exc, "compile", program=name, slice="", host=self.host
            )
            return
        empty = [i for i, a in enumerate(exp.out_avals) if a.dtype == jax.dtypes.float0]
        if empty:
            # XLA hands float0 outputs back as NumPy arrays, which the store and the
            # completion thread do not hold: refused here, every launch of it fails.
            self._bad_programs[pid] = RemoteError(
                f"program {name} returns float0 arrays (outputs {empty}), which hold no "
                "values; a host keeps arrays only. pw.jit leaves them out of the programs "
                "it exports: export with it, or drop those outputs",
                kind="invalid",
            )
            return
        self._programs[pid] = Program(
            name, exp, in_specs=list(in_specs), options=options or {}, axis_types=list(axis_types)
        )

    def forget(self, pids: set[str]) -> None:
        """Drop these programs and every executable compiled from them."""
        with self._lock:
            for pid in pids:
                self._programs.pop(pid, None)
                self._bad_programs.pop(pid, None)
            for key in [k for k in self._executables if k[0] in pids]:
                del self._executables[key]

    def mesh(self, devices: Sequence[int], mesh: Sequence[Sequence[Any]]) -> Mesh:
        key = (tuple(devices), tuple((str(a), int(n)) for a, n in mesh))
        m = self._meshes.get(key)
        if m is None:
            try:
                devs = [self._devices[int(d)] for d in devices]
            except KeyError as exc:
                raise RemoteError(
                    f"device {exc.args[0]} is not on host {self.host} "
                    f"(it has {sorted(self._devices)})",
                    kind="invalid",
                ) from None
            shape = [int(n) for _, n in mesh]
            if math.prod(shape) != len(devs):
                raise RemoteError(f"mesh {mesh} does not fit {len(devs)} devices", kind="invalid")
            m = Mesh(np.array(devs, dtype=object).reshape(shape), tuple(str(a) for a, _ in mesh))
            self._meshes[key] = m
        return m

    def executable(self, pid: str, mesh: Mesh, donate: tuple[int, ...]) -> Any:
        key = (pid, id(mesh), donate)
        with self._lock:
            fn = self._executables.get(key)
            if fn is not None:
                self._executables.move_to_end(key)
                return fn
            compiling = self._compiling.get(key)
            mine = compiling is None
            if compiling is None:
                compiling = self._compiling[key] = concurrent.futures.Future()
        if not mine:
            return compiling.result()  # the other thread's compile, or its error
        try:
            prog = self.program(pid)
            if prog.python is not None:
                fn = prog.python.bind(mesh)
            elif prog.hlo is not None:
                fn = prog.hlo.bind(mesh)
            else:
                fn = self._compile(prog, mesh, donate)
        except BaseException as exc:
            with self._lock:
                del self._compiling[key]
            compiling.set_exception(exc)
            raise
        with self._lock:
            del self._compiling[key]
            self._executables[key] = fn
            if len(self._executables) > self.max_executables:
                self._executables.popitem(last=False)
        compiling.set_result(fn)
        return fn

    def _compile(self, prog: Program, mesh: Mesh, donate: tuple[int, ...]) -> Any:
        # A program that is not a Python function is an export (see add).
        exp = cast(export.Exported, prog.exported)
        if prog.axis_types:
            # The export's shardings name a mesh of these types; arrays on the plain
            # mesh (puts, transfers) are passed to it as they are.
            mesh = Mesh(
                mesh.devices,
                mesh.axis_names,
                axis_types=tuple(AxisType[t] for t in prog.axis_types),
            )
        in_sh = [
            s
            if s is not None
            else NamedSharding(
                mesh, decode_spec(prog.in_specs[i]) if i < len(prog.in_specs) else P()
            )
            for i, s in enumerate(exp.in_shardings_jax(mesh))
        ]
        out_sh = exp.out_shardings_jax(mesh)
        # Known output layouts also fix the device count for programs without inputs.
        kw = (
            {"out_shardings": jax.tree.unflatten(exp.out_tree, list(out_sh))}
            if all(s is not None for s in out_sh)
            else {}
        )
        jitted = jax.jit(
            _named(exp.call, prog.name), in_shardings=in_sh, donate_argnums=donate, **kw
        )
        avals = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(exp.in_avals, in_sh, strict=True)
        ]
        fn = jitted.lower(*avals).compile(prog.options or None)
        with self._lock:
            self.compiles += 1
        if self.after_compile is not None:
            self.after_compile()
        return fn

    def program(self, pid: str) -> Program:
        prog = self._programs.get(pid)
        if prog is None:
            bad = self._bad_programs.get(pid)
            if bad is not None:
                raise bad
            raise RemoteError(f"program {pid} is unknown on host {self.host}", kind="invalid")
        return prog

    def probe_reply(self, h: dict[str, Any]) -> dict[str, Any]:
        """The answer to a ``host_probe``: the layouts the compiler chose for the
        program's outputs on these devices, or why it could not compile. With
        ``analysis``, what ``jax.stages.Compiled`` tells of the executable as well (its
        memory, cost and optimized HLO), compiled with the donations its launches use."""
        try:
            if self.program(h["pid"]).python is not None:
                raise RemoteError(
                    "a colocated Python function has no compiled layouts to probe: its "
                    "out= declares them",
                    kind="invalid",
                )
            donate = tuple(sorted(int(i) for i in h.get("donate") or ()))
            fn = self.executable(h["pid"], self.mesh(h["devices"], h["mesh"]), donate)
            if self.program(h["pid"]).hlo is not None:
                reply = {"t": "host_reply", "rid": h["rid"], "executable": fn.describe()}
                if h.get("analysis"):
                    reply |= _analysis(fn)
                return reply
            specs = [
                encode_spec(s.spec) if isinstance(s, NamedSharding) else None
                for s in fn.output_shardings
            ]
            reply = {"t": "host_reply", "rid": h["rid"], "out_specs": specs}
            if h.get("analysis"):
                reply |= _analysis(fn)
            return reply
        except Exception as exc:
            err = to_remote(exc, "compile", program=self.name(h["pid"]), slice="", host=self.host)
            return {"t": "host_reply", "rid": h["rid"], "error": err.to_dict()}


def _analysis(fn: Any) -> dict[str, Any]:
    """What a client's ``Lowered.compile()`` reads: memory statistics (bytes), the cost
    analysis and the optimized HLO, in plain types."""
    mem = fn.memory_analysis()
    memory = (
        {a: int(getattr(mem, a)) for a in dir(mem) if a.endswith("_in_bytes")}
        if mem is not None
        else None
    )
    cost = fn.cost_analysis()
    if isinstance(cost, list | tuple):  # one dict per device program in older JAX
        cost = cost[0] if cost else {}
    return {
        "memory": memory,
        "cost": {str(k): float(v) for k, v in (cost or {}).items()},
        "hlo": fn.as_text() or "",
    }


def run_key(h: dict[str, Any]) -> tuple[Any, ...]:
    """What picks an executable for a ``run`` message: its program, devices, mesh and
    donated arguments."""
    return (h["pid"], tuple(h["devices"]), tuple(map(tuple, h["mesh"])), tuple(h["donate"]))


def _named(call: Any, name: str) -> Any:
    """``call`` under the program's name, which XLA then gives the executable: a
    profile's device events read ``Execute (jit_encode)``, not every program's
    ``jit_call``."""

    def program(*args: Any) -> Any:
        return call(*args)

    program.__name__ = program.__qualname__ = re.sub(r"\W", "_", name) or "program"
    return program
