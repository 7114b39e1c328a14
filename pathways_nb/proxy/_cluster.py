"""What a proxy session does on the cluster, through its own ``pw.Client``.

Array bytes go between the proxy and the host that holds them, never through the
controller; programs are launched through the controller, which orders them among every
tenant's on the island.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import op_shardings
from jax._src.lib import xla_client as xc
from jax.sharding import PartitionSpec

from pathways_nb._core import encode_dtype, encode_spec, hlo_blob, op_sharding, program_id
from pathways_nb.client._export import Program
from pathways_nb.proxy import _status
from pathways_nb.proxy._layouts import Layout, summed
from pathways_nb.proxy._modules import Signature
from pathways_nb.proxy._session import Entry
from pathways_nb.proxy._status import ProxyError

# What tells the proxy's programs apart from other programs of the same bytes.
_KEY = b"pw.proxy"


@dataclasses.dataclass
class Executable:
    """A program compiled on an island's host for some of its devices."""

    program: Program
    island: int
    devices: tuple[int, ...]
    positions: tuple[int, ...]
    signature: Signature
    info: dict[str, Any]
    analysis: dict[str, Any]
    out_layouts: list[Layout]
    deleted: bool = False


class ClusterBackend:
    """A session's slices (one per island, each over all its devices) and the
    operations on them. IFRT device ids count the islands' devices in order."""

    def __init__(self, client: Any, name: str = "") -> None:
        self.client = client
        self.name = name
        self.slices: list[Any] = []
        # IFRT device id -> (island index, position among its slice's devices).
        self.where: dict[int, tuple[int, int]] = {}

    def allocate(self, islands: int | None = None) -> None:
        """One slice per island over the devices it has free (of the first ``islands``
        islands, if given); IFRT ids count them island by island."""
        status = self.client.status()
        cols = status.COLUMNS["islands"]
        rows = status.rows["islands"][: islands if islands is not None else None]
        free = [(str(r[cols.index("island")]), int(r[cols.index("free")])) for r in rows]
        if not any(n for _, n in free):
            held = ", ".join(f"{i}" for i, _ in free) or "none"
            raise ProxyError(
                _status.RESOURCE_EXHAUSTED,
                f"no island has free devices (islands: {held}); release slices other "
                "clients hold, or start the proxy on a cluster with room",
            )
        got = {}
        # Largest first: each then fits exactly one island of those left, whichever the
        # resource manager picks among equals (so its name, the manager's, promises none).
        for _, n in sorted((f for f in free if f[1]), key=lambda f: -f[1]):
            vs = self.client.allocate({"devices": n})
            got[vs.island] = vs
        order = [i for i, _ in free]
        self.slices = sorted(
            got.values(), key=lambda v: order.index(v.island) if v.island in order else len(order)
        )
        nid = 0
        for i, vs in enumerate(self.slices):
            for p in range(len(vs.devices)):
                self.where[nid + p] = (i, p)
            nid += len(vs.devices)

    def close(self) -> None:
        self.client.close()

    # -- devices --------------------------------------------------------------------
    def describe(self, session_id: int, body: Any) -> None:
        """Fill an ``InitResponse``: the session's devices, one memory each."""
        platform = self.slices[0].platform if self.slices else "cpu"
        body.session_id = session_id
        body.platform_name = platform
        body.platform_version = f"pathways_nb {_version()} (jax {jax.__version__})"
        body.process_index = 0
        body.runtime_type = "pathways_nb"
        for nid, (island, pos) in sorted(self.where.items()):
            vs = self.slices[island]
            d = body.all_devices.add()
            d.id = nid
            d.local_device_id = nid
            d.local_hardware_id = pos
            d.platform_name = platform
            d.device_kind = platform
            d.default_memory_id = nid
            d.memory_ids.append(nid)
            d.debug_string = f"{platform}:{nid} (island {vs.island}, slice {vs.name})"
            d.to_string = f"PathwaysDevice(id={nid}, slice_index={island})"
            d.attributes.attributes["slice_index"].int64_value = island
            d.attributes.attributes["island"].string_value = str(vs.island).encode()
            m = body.memories.add()
            m.id = nid
            m.memory_space_kind = "device"
            m.kind_id = 0
            m.device_ids.append(nid)
            m.debug_string = m.to_string = f"device memory of {platform}:{nid}"
            body.primary_device_ids.append(nid)
            body.addressable_device_ids.append(nid)

    def place(self, devices: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        """The island and positions of these IFRT devices, which must share an island."""
        try:
            spots = [self.where[int(d)] for d in devices]
        except KeyError as exc:
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"device {exc.args[0]} is not one of this session's (0..{len(self.where) - 1})",
            ) from None
        if not spots:
            raise ProxyError(_status.INVALID_ARGUMENT, "an array or program names no devices")
        islands = sorted({i for i, _ in spots})
        if len(islands) > 1:
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"devices {list(devices)} lie on islands {islands}; a pathways_nb program or "
                "array lives on the devices of one island (slice_index). Put the mesh on "
                "one island's devices, and move arrays between islands with jax.device_put",
            )
        return islands[0], tuple(p for _, p in spots)

    def default_devices(self, n: int) -> list[int]:
        size = len(self.slices[0].devices) if self.slices else 0
        if n > size:
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"{n} devices asked for by default; an island here has {size}",
            )
        return list(range(n))

    # -- arrays -----------------------------------------------------------------------
    def regions(self, layout: Layout, shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
        """Each device's part of an array of ``shape`` laid out by ``layout``, in the
        layout's device order."""
        # Unreduced devices hold partial sums of the same region: placed as replicas.
        hlo = xc.HloSharding.from_proto(op_sharding(summed(layout.op)))
        return list(op_shardings.op_sharding_to_indices(hlo, shape, len(layout.devices)))

    def put(self, value: np.ndarray, layout: Layout) -> Entry:
        island, positions = self.place(layout.devices)
        op = b"" if len(positions) == 1 else layout.op
        remote = self.client._put_hlo(self.slices[island], value, op, list(positions))
        return Entry(remote, tuple(value.shape), value.dtype, Layout(layout.devices, op), island)

    def single(self, e: Entry, device: int) -> Entry:
        """A single-device view of a replicated array: the same RemoteArray, read whole."""
        return Entry(e.remote, e.shape, e.dtype, Layout((device,)), e.island, view=True)

    def fetch(self, e: Entry) -> np.ndarray:
        return np.asarray(self.client.fetch(e.remote))

    def wait(self, entries: list[Entry]) -> None:
        self.client.block_until_ready([e.remote for e in entries])

    def move(
        self, e: Entry, layout: Layout, shard: tuple[int, tuple[int, ...]] | None = None
    ) -> Entry:
        """A copy of ``e`` laid out by ``layout``, on its island or another (of one
        device's buffer of it, with ``shard``: its position and shape): the bytes go host
        to host (from the host to itself, for a reshard), never through here."""
        island, positions = self.place(layout.devices)
        op = b"" if len(positions) == 1 else layout.op
        remote = self.client._move_hlo(e.remote, self.slices[island], op, list(positions), shard)
        shape = e.shape if shard is None else shard[1]
        return Entry(remote, shape, e.dtype, Layout(layout.devices, op), island)

    def copy(self, e: Entry) -> Entry:
        """A copy of ``e`` of its own, on the same devices and layout."""
        return self.move(e, e.layout)

    def relayout(self, e: Entry, layout: Layout) -> Entry:
        if layout.devices == e.layout.devices and layout.op == e.layout.op and not e.view:
            return Entry(e.remote, e.shape, e.dtype, e.layout, e.island)
        return self.move(e, layout)

    def disassemble(self, e: Entry) -> list[Entry]:
        """Each device's buffer of ``e``, an array of its own on that device."""
        regions = self.regions(e.layout, e.shape)
        return [
            self.move(e, Layout((d,)), (i, _extent(region, e.shape)))
            for i, (d, region) in enumerate(zip(e.layout.devices, regions, strict=True))
        ]

    def assemble(self, parts: list[Entry], shape: tuple[int, ...], layout: Layout) -> Entry:
        if len(parts) != len(layout.devices):
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"{len(parts)} single-device arrays for a sharding over "
                f"{len(layout.devices)} devices",
            )
        value = np.zeros(shape, parts[0].dtype)
        for part, region in zip(parts, self.regions(layout, shape), strict=True):
            value[region] = self.fetch(part)
        return self.put(value, layout)

    # -- programs ---------------------------------------------------------------------
    def compile(
        self, module: bytes, options: bytes, devices: tuple[int, ...], signature: Signature
    ) -> Executable:
        island, positions = self.place(devices)
        vs = self.slices[island]
        outputs = [(shape, encode_dtype(dtype)) for shape, dtype in signature.results]
        blob = hlo_blob(module, options, positions, outputs)
        prog = Program(
            pid=program_id(blob, _KEY, kind="hlo"),
            name=signature.name,
            blob=blob,
            key=_KEY,
            nin=len(signature.params),
            out_tree=jax.tree.structure([0] * len(outputs)),
            out_avals=[jax.ShapeDtypeStruct(s, d) for s, d in signature.results],
            out_specs=[PartitionSpec()] * len(outputs),
            donate=tuple(signature.donated),
            platform=vs.platform,
            in_specs=[encode_spec(PartitionSpec())] * len(signature.params),
            kind="hlo",
        )
        self.client._register(prog, vs)
        h = self.client._ask(
            {
                "t": "probe",
                "slice": vs.id,
                "pid": prog.pid,
                "donate": list(prog.donate),
                "analysis": True,
            },
            timeout=None,
        )
        info = h["executable"]
        # None reported (one device), or one for the empty tuple of a program without
        # results.
        ops = [bytes(op) for op in info["out_shardings"]] if outputs else []
        ops = ops or [b""] * len(outputs)
        if len(ops) != len(outputs):
            raise ProxyError(
                _status.INTERNAL,
                f"{signature.name} compiled to {len(ops)} output shardings for "
                f"{len(outputs)} results",
            )
        out_layouts = [Layout(devices, b"" if len(devices) == 1 else op) for op in ops]
        analysis = {k: h.get(k) for k in ("memory", "cost", "hlo")}
        return Executable(prog, island, devices, positions, signature, info, analysis, out_layouts)

    def launch(self, exe: Executable, args: list[Entry]) -> list[Entry]:
        arrays = []
        takes = exe.info["in_shardings"]
        for i, a in enumerate(args):
            if a.view or a.island != exe.island:
                # A view (one device of a replicated array), or an array of another
                # island: laid out as the program takes it first.
                op = bytes(takes[i]) if i < len(takes) and len(exe.devices) > 1 else b""
                a = self.move(a, Layout(exe.devices, op))
            arrays.append(a.remote)
        outs = self.client._launch(exe.program, self.slices[exe.island], arrays)
        return [
            Entry(r, tuple(r.shape), np.dtype(r.dtype), layout, exe.island)
            for r, layout in zip(outs, exe.out_layouts, strict=True)
        ]


def _extent(region: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of an index region of an array of ``shape``."""
    return tuple(len(range(*r.indices(n))) for r, n in zip(region, shape, strict=True))


def _version() -> str:
    import pathways_nb

    return pathways_nb.__version__
