"""The dataflow graph of a step: programs as nodes, remote arrays and transfers as edges.

``pw.graph(step, *args)`` traces ``step`` with shapes alone: every ``pw.jit`` call in it
is traced and exported as usual but not launched, arrays it would move between slices
become transfer edges, and its results are :class:`GraphArray` placeholders. Nothing
runs, nothing is sent, nothing is donated. ``client.record()`` records a step that
really runs; :meth:`DataflowGraph.annotate` then adds the times from the event log.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_nb.client._jit import RemoteFunction
from pathways_nb.client._remote import RemoteArray

if TYPE_CHECKING:
    import pandas as pd

    from pathways_nb.client._session import Client
    from pathways_nb.client._slice import VirtualSlice

_fake_handles = itertools.count(1)


class GraphArray(RemoteArray):
    """What a traced program would return: shape, dtype, sharding and slice, no value."""

    __slots__ = ()

    def __init__(
        self, client: Client, shape: Any, dtype: Any, sharding: Any, slice: VirtualSlice
    ) -> None:
        super().__init__(client, -next(_fake_handles), shape, dtype, sharding, slice, 0)

    def __repr__(self) -> str:
        return (
            f"GraphArray(shape={self.shape}, dtype={self.dtype}, slice={self.slice.name!r}, "
            f"spec={self.spec})"
        )

    def __del__(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def is_ready(self) -> bool:
        return False

    def _check_usable(self) -> None:
        if _active() is None:
            raise TypeError(
                "this array comes from pw.graph, which traces shapes only; it has no value. "
                "Call the step with real arrays to run it."
            )

    def fetch(self) -> Any:
        raise TypeError("an array from pw.graph has a shape but no value: nothing ran")

    def block_until_ready(self) -> RemoteArray:
        self.fetch()
        return self


@dataclasses.dataclass
class _Node:
    id: int
    kind: str  # "program" | "input"
    name: str
    slice: str
    island: str
    lid: int = 0


@dataclasses.dataclass
class _Edge:
    src: int
    dst: int
    kind: str  # "array" | "transfer"
    shape: tuple[int, ...]
    dtype: str
    spec: str
    from_slice: str
    to_slice: str
    bytes: int
    lid: int = 0  # the transfer's launch id in a recorded run


_FIELDS_NODE = ["id", "kind", "name", "slice", "island", "lid"]
_FIELDS_EDGE = [
    "src",
    "dst",
    "kind",
    "shape",
    "dtype",
    "spec",
    "from_slice",
    "to_slice",
    "bytes",
    "lid",
]


class DataflowGraph:
    """Programs and the arrays and transfers between them; see :func:`graph`.

    ``nodes`` and ``edges`` are pandas DataFrames; ``to_dot()`` is Graphviz source.
    """

    def __init__(
        self,
        name: str,
        nodes: list[_Node],
        edges: list[_Edge],
        client: Client | None,
        since: float = 0.0,
    ) -> None:
        self.name = name
        self._nodes = nodes
        self._edges = edges
        self._client = client
        self._since = since
        self._times: dict[int, tuple[float, float]] = {}

    @property
    def nodes(self) -> pd.DataFrame:
        import pandas as pd

        df = pd.DataFrame([dataclasses.astuple(n) for n in self._nodes], columns=_FIELDS_NODE)
        if self._times:
            df["start"] = [self._time(n.lid, 0) for n in self._nodes]
            df["end"] = [self._time(n.lid, 1) for n in self._nodes]
        return df

    @property
    def edges(self) -> pd.DataFrame:
        import pandas as pd

        df = pd.DataFrame([dataclasses.astuple(e) for e in self._edges], columns=_FIELDS_EDGE)
        if self._times:
            df["start"] = [self._time(e.lid, 0) for e in self._edges]
            df["end"] = [self._time(e.lid, 1) for e in self._edges]
        return df

    def _time(self, lid: int, i: int) -> Any:
        import pandas as pd

        t = self._times.get(lid)
        return pd.NaT if t is None else pd.to_datetime(t[i], unit="s")

    @property
    def programs(self) -> int:
        return sum(1 for n in self._nodes if n.kind == "program")

    @property
    def transfers(self) -> int:
        return sum(1 for e in self._edges if e.kind == "transfer")

    def annotate(self, events: pd.DataFrame | None = None) -> DataflowGraph:
        """Add start and end times from the event log (a recorded step only).

        ``events`` defaults to the client's own since the recording began; it waits for
        the recorded launches to finish first.
        """
        lids = {n.lid for n in self._nodes if n.lid} | {e.lid for e in self._edges if e.lid}
        if not lids:
            raise ValueError(
                "this graph was traced with shapes only (pw.graph), so nothing ran; record a "
                "step that runs with `with client.record() as g:` to see its times"
            )
        if events is None:
            if self._client is None:
                raise ValueError("pass the event log: graph.annotate(client.events())")
            self._client.wait_all()
            events = self._client.events(since=self._since)
        times: dict[int, list[float]] = {}
        for lid, kind, t in zip(events["lid"], events["kind"], events["time"], strict=True):
            if lid in lids and kind in ("start", "end", "error"):
                slot = times.setdefault(int(lid), [float("nan"), float("nan")])
                slot[0 if kind == "start" else 1] = t.timestamp()
        self._times = {k: (v[0], v[1]) for k, v in times.items()}
        return self

    def to_graphviz(self) -> Any:
        """The graph as a ``graphviz.Digraph``: one cluster per slice, transfers dashed.

        Its ``.source`` is DOT; rendering it to a file needs the ``dot`` binary, drawing
        it in a notebook does not (the graph widget bundles Graphviz).
        """
        import graphviz

        # A plain identifier: graphviz reads "<lambda>" as an HTML-like string.
        ident = re.sub(r"\W", "_", self.name).strip("_") or "step"
        g = graphviz.Digraph(ident, graph_attr={"rankdir": "LR"}, node_attr={"shape": "box"})
        by_slice: dict[str, list[_Node]] = {}
        for n in self._nodes:
            by_slice.setdefault(n.slice, []).append(n)
        for i, (sname, nodes) in enumerate(sorted(by_slice.items())):
            with g.subgraph(name=f"cluster_{i}") as c:
                c.attr(label=_label([f"slice {sname} ({nodes[0].island})"]))
                for n in nodes:
                    parts = [n.name]
                    t = self._times.get(n.lid)
                    if t is not None:
                        parts.append(f"{1e3 * (t[1] - t[0]):.2f} ms")
                    shape = "box" if n.kind == "program" else "ellipse"
                    c.node(f"n{n.id}", label=_label(parts), shape=shape)
        for e in self._edges:
            parts = [f"{e.dtype}{list(e.shape)} {e.spec}"]
            style: dict[str, str] = {}
            if e.kind == "transfer":
                parts.append(f"{e.from_slice}→{e.to_slice} {_human(e.bytes)}")
                style = {"style": "dashed", "color": "blue"}
            g.edge(f"n{e.src}", f"n{e.dst}", label=_label(parts), **style)
        return g

    def to_dot(self) -> str:
        """Graphviz DOT source of :meth:`to_graphviz`."""
        return str(self.to_graphviz().source)

    def __repr__(self) -> str:
        return f"<{self._summary()}>"

    def _summary(self) -> str:
        slices = sorted({n.slice for n in self._nodes})
        moved = sum(e.bytes for e in self._edges if e.kind == "transfer")
        return (
            f"DataflowGraph {self.name!r}: {self.programs} programs on {len(slices)} slices "
            f"{slices}, {len(self._edges)} edges, {self.transfers} transfers "
            f"({_human(moved)} moved)"
        )

    def _repr_html_(self) -> str:
        """In a notebook: the summary, then the programs by slice and the edges between
        them as tables (``pw.viz.graph(step, ...)`` draws the graph itself)."""
        import pandas as pd

        names = {n.id: n.name for n in self._nodes}
        programs = pd.DataFrame(
            [(n.name, n.kind, n.slice, n.island) for n in self._nodes],
            columns=["program", "kind", "slice", "island"],
        )
        if self._times:
            programs["ms"] = [
                f"{1e3 * (t[1] - t[0]):.2f}" if (t := self._times.get(n.lid)) else ""
                for n in self._nodes
            ]
        programs = programs.sort_values(["slice"], kind="stable")
        edges = pd.DataFrame(
            [
                (
                    names.get(e.src, e.src),
                    names.get(e.dst, e.dst),
                    e.kind,
                    f"{e.dtype}{list(e.shape)}",
                    e.spec,
                    f"{e.from_slice} → {e.to_slice}" if e.kind == "transfer" else e.from_slice,
                    _human(e.bytes),
                )
                for e in self._edges
            ],
            columns=["from", "to", "kind", "array", "spec", "slices", "bytes"],
        )
        return (
            f"<p><b>{html.escape(self._summary())}</b></p>"
            f"<h4>programs</h4>{programs.to_html(index=False, border=0)}"
            f"<h4>edges</h4>{edges.to_html(index=False, border=0)}"
        )


def _label(lines: list[str]) -> str:
    """A label of several lines, each drawn as written.

    Names come from users (a program named ``<lambda>``, a slice named ``\\N``), so
    nothing in them may reach Graphviz as markup: ``nohtml`` keeps a ``<...>`` name
    from becoming an HTML-like label (which the graph widget would put into the page),
    doubled backslashes keep ``\\N``, ``\\G`` or ``\\l`` from being expanded, and
    ``&amp;`` keeps ``&lt;`` from being decoded. The graphviz package then quotes the
    result and escapes its double quotes.
    """
    import graphviz

    def literal(text: str) -> str:
        text = text.replace("\\", "\\\\").replace("&", "&amp;")
        return re.sub(r"\r\n|\r|\n", r"\\n", text)

    return graphviz.nohtml("\\n".join(literal(x) for x in lines))


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


class Recorder:
    """Collects nodes and edges while a step is traced (``tracing``) or run."""

    def __init__(self, client: Client, name: str, tracing: bool) -> None:
        self.client = client
        self.name = name
        self.tracing = tracing
        self.thread = threading.get_ident()
        self.nodes: list[_Node] = []
        self.edges: list[_Edge] = []
        # handle of an array -> the node that made it
        self._producer: dict[int, int] = {}
        # handle of a moved copy -> (source array, transfer lid)
        self._moved: dict[int, tuple[RemoteArray, int]] = {}
        self._keep: list[Any] = []  # arrays whose handles key the maps above

    def _node_of(self, x: RemoteArray) -> int:
        nid = self._producer.get(x.handle)
        if nid is None:
            nid = self._add_node("input", "input", x.slice)
            self._producer[x.handle] = nid
            self._keep.append(x)
        return nid

    def _add_node(self, kind: str, name: str, vs: VirtualSlice, lid: int = 0) -> int:
        nid = len(self.nodes)
        self.nodes.append(_Node(nid, kind, name, vs.name, vs.island, lid))
        return nid

    def moved(self, x: RemoteArray, copy: RemoteArray, lid: int) -> None:
        self._moved[copy.handle] = (x, lid)
        self._keep.append(copy)

    def put(self, vs: VirtualSlice, value: Any, spec: PartitionSpec) -> RemoteArray:
        """Tracing: a local value the step would put on ``vs``."""
        arr = np.asarray(value)
        vs.check_spec(spec, arr.shape)
        # As a real put: without x64, 64-bit values become their 32-bit kin.
        dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
        out = GraphArray(self.client, arr.shape, dtype, NamedSharding(vs.abstract_mesh, spec), vs)
        self._producer[out.handle] = self._add_node("input", "put", vs)
        self._keep.append(out)
        return out

    def move(self, x: RemoteArray, vs: VirtualSlice, spec: PartitionSpec) -> RemoteArray:
        """Tracing: the copy of ``x`` a transfer would make on ``vs``."""
        out = GraphArray(self.client, x.shape, x.dtype, NamedSharding(vs.abstract_mesh, spec), vs)
        self.moved(x, out, 0)
        return out

    def program(
        self,
        name: str,
        vs: VirtualSlice,
        arrays: Sequence[RemoteArray],
        outs: Sequence[RemoteArray],
        lid: int = 0,
    ) -> None:
        sources = []
        for a in arrays:
            moved = self._moved.get(a.handle)
            if moved is not None:
                src, tlid = moved
                sources.append((self._node_of(src), "transfer", a, src.slice, tlid))
            else:
                sources.append((self._node_of(a), "array", a, a.slice, 0))
        nid = self._add_node("program", name, vs, lid)
        for src_id, kind, a, frm, tlid in sources:
            self.edges.append(_edge(src_id, nid, kind, a, frm, tlid))
        for o in outs:
            self._producer[o.handle] = nid
            self._keep.append(o)


def _edge(src: int, dst: int, kind: str, a: RemoteArray, frm: Any, lid: int) -> _Edge:
    return _Edge(
        src,
        dst,
        kind,
        tuple(a.shape),
        str(a.dtype),
        str(a.spec),
        frm.name,
        a.slice.name,
        a.nbytes,
        lid,
    )


_ACTIVE: Recorder | None = None
_lock = threading.Lock()


def _active() -> Recorder | None:
    rec = _ACTIVE
    if rec is not None and rec.thread == threading.get_ident():
        return rec
    return None


def active() -> Recorder | None:
    """The recorder of this thread's step being traced or recorded, if any."""
    return _active()


class _Recording:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def __enter__(self) -> Recorder:
        global _ACTIVE
        with _lock:
            if _ACTIVE is not None:
                raise RuntimeError("a step is already being traced or recorded")
            _ACTIVE = self.rec
        return self.rec

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        with _lock:
            _ACTIVE = None


def trace_graph(client: Client, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The dataflow graph of ``fn(*args, **kwargs)``, from shapes alone."""
    # A pw.jit's __name__ is its function's (often "<lambda>"); its name= is the one given.
    name = fn.name if isinstance(fn, RemoteFunction) else getattr(fn, "__name__", "step")
    rec = Recorder(client, name, tracing=True)
    with _Recording(rec):
        fn(*args, **kwargs)
    return DataflowGraph(name, rec.nodes, rec.edges, client)


class Recording:
    """``with client.record() as g:`` runs a step and fills ``g`` with its graph."""

    def __init__(self, client: Client, name: str = "step") -> None:
        import time

        self._rec = Recorder(client, name, tracing=False)
        self._ctx = _Recording(self._rec)
        self.graph = DataflowGraph(name, self._rec.nodes, self._rec.edges, client, time.time())

    def __enter__(self) -> DataflowGraph:
        self._ctx.__enter__()
        return self.graph

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)
        self._rec._keep.clear()
