"""VirtualSlice: a named mesh of virtual devices that the controller maps onto an island."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pathways_nb._core import ClosedError, DataLossError, entry_axes

if TYPE_CHECKING:
    from jax.sharding import PartitionSpec

    from pathways_nb.client._session import Client


@dataclasses.dataclass(frozen=True)
class VirtualDevice:
    """One virtual device of a slice, and the physical device it is mapped onto now.

    ``id`` is its place in the slice's mesh (row-major over the mesh axes, as
    ``jax.sharding.Mesh`` lays out devices); ``device_id`` is the id of the device on
    ``host`` that holds its shards. ``RemoteArray.devices()`` gives a set of these.
    """

    id: int
    slice: str
    island: str
    host: str
    device_id: int
    platform: str

    def __repr__(self) -> str:
        return (
            f"VirtualDevice(id={self.id}, slice={self.slice!r}, host={self.host!r}, "
            f"device={self.platform}:{self.device_id})"
        )


def axis_types_for(axis_types: Any, names: Sequence[str]) -> tuple[Any, ...]:
    """``allocate``'s ``axis_types`` as one ``jax.sharding.AxisType`` per mesh axis, as
    ``jax.make_mesh`` takes them: None (Auto for every axis), one type for every axis,
    or one per axis; a type may be given by name ("explicit")."""
    from jax.sharding import AxisType

    if axis_types is None:
        return ()

    def one(t: Any) -> Any:
        if isinstance(t, AxisType):
            return t
        if isinstance(t, str):
            for member in AxisType:
                if member.name.lower() == t.lower():
                    return member
        known = ", ".join(repr(m.name.lower()) for m in AxisType)
        raise ValueError(
            f"axis_types takes jax.sharding.AxisType values (or their names: {known}); got {t!r}"
        )

    if isinstance(axis_types, AxisType | str):
        return tuple(one(axis_types) for _ in names)
    if not isinstance(axis_types, list | tuple) or len(axis_types) != len(names):
        raise ValueError(
            f"axis_types gives one type per mesh axis ({len(names)}: {list(names)}), or one "
            f"for all of them; got {axis_types!r}"
        )
    return tuple(one(t) for t in axis_types)


class VirtualSlice:
    """A virtual slice: ``client.allocate({"data": 4})``.

    ``with vs:`` makes it the default slice for ``pw.jit`` calls in the block;
    ``vs.put(array, P("data"))`` places an array on it; ``vs.release()`` frees it.

    When its host is lost the slice is ``"lost"`` (so are its arrays); once devices of
    its platform are free for it (another island's at once, else a host that joins, the
    restarted one first, or devices a release frees), the controller maps it there and it
    is ``"active"`` again, as the same object. New work for it waits for that (see
    :meth:`put`), as does ``vs.wait_active()``; from then on it runs on the new devices.
    """

    def __init__(
        self,
        client: Client,
        sid: str,
        name: str,
        mesh: dict[str, int],
        island: str,
        host: str,
        devices: list[int],
        data_address: str,
        platform: str,
        bounded: bool = False,
        axis_types: tuple[Any, ...] = (),
    ) -> None:
        from jax.sharding import AbstractMesh

        self._client = client
        self.id = sid
        self.name = name
        self.mesh_shape = dict(mesh)
        self.island = island
        self.host = host
        self.devices = list(devices)
        self.data_address = data_address
        self.platform = platform
        # Whether the host bounds what it keeps for this client (a store limit or a
        # quota): launches then take the deletions queued before them along.
        self._bounded = bounded
        self.state = "active"
        # As jax.make_mesh's: how JAX treats each axis while tracing (Auto unless asked).
        self.abstract_mesh: AbstractMesh = AbstractMesh(
            tuple(mesh.values()), tuple(mesh.keys()), axis_types=axis_types or None
        )
        # What a traced program depends on: the mesh's shape, its axis types, the platform.
        self.signature = (tuple(mesh.items()), self.abstract_mesh.axis_types, platform)
        self._previous: list[VirtualSlice | None] = []
        # How many times the slice was remapped, and the host it was on at each count:
        # an array made before the last remap was lost with its host.
        self.epoch = 0
        self._hosts = [host]
        self._changed = threading.Condition()

    @property
    def size(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def virtual_devices(self) -> list[VirtualDevice]:
        """The slice's virtual devices in mesh order, each with the host device it is on."""
        return [
            VirtualDevice(i, self.name, self.island, self.host, int(d), self.platform)
            for i, d in enumerate(self.devices)
        ]

    def __repr__(self) -> str:
        types = [t.name.lower() for t in self.abstract_mesh.axis_types]
        shown = f", axis_types={types}" if any(t != "auto" for t in types) else ""
        return (
            f"VirtualSlice({self.name!r}, mesh={self.mesh_shape}{shown}, "
            f"island={self.island!r}, devices={self.devices}, {self.state})"
        )

    def wait_active(self, timeout: float | None = None) -> VirtualSlice:
        """Return once the slice can run programs: at once if it is active; if it was
        lost, once the controller has remapped it onto a host with room for it.
        Raises :class:`TimeoutError` if that takes longer than ``timeout`` seconds, and
        ``ClosedError`` for a released slice or a closed client. Interrupting the kernel
        stops the wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self.state == "lost":
                self._client._check_open()  # a closed client hears no remap
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"slice {self.name!r} ({self.size} devices) is still lost after "
                        f"{timeout} s: no live island has joined with {self.size} free "
                        f"{self.platform} devices. Restart or add a host, or release slices "
                        "(client.status() shows what is free)"
                    )
                self._changed.wait(0.1 if left is None else min(left, 0.1))
        self.check_active()
        return self

    def _set_state(self, state: str) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()

    def _remapped(
        self, info: dict[str, Any], data_address: str, platform: str, bounded: bool = False
    ) -> None:
        """The controller mapped this lost slice onto another host's devices."""
        with self._changed:
            self._bounded = bounded
            self.island = str(info["island"])
            self.host = str(info["host"])
            self.devices = [int(d) for d in info["devices"]]
            self.data_address = data_address
            self.platform = platform
            self.signature = (
                tuple(self.mesh_shape.items()),
                self.abstract_mesh.axis_types,
                platform,
            )
            self.epoch += 1
            self._hosts.append(self.host)
            self.state = "active"
            self._changed.notify_all()

    def check_active(self) -> None:
        if self.state == "released":
            # A closed client's slices read released too: say what closed them.
            self._client._check_open()
            raise ClosedError(f"slice {self.name!r} was released; allocate a new one")
        if self.state == "lost":
            raise DataLossError(
                f"slice {self.name!r} was lost with host {self.host}",
                slice=self.name,
                host=self.host,
            )

    def _ready_for_work(self) -> None:
        """Return once new work (a put, a program, an array moved here) can go to the
        slice: at once if it is active; if it is lost, once it has been remapped, for up
        to the client's ``remap_wait_seconds``. Raises DataLossError after that, and
        ClosedError for a released slice."""
        if self.state != "lost":
            self.check_active()
            return
        wait = self._client.remap_wait_seconds
        if wait <= 0:
            self.check_active()
        try:
            self.wait_active(wait)
        except TimeoutError:
            raise DataLossError(
                f"slice {self.name!r} was lost with host {self.host} and has not been "
                f"remapped after {wait:g} s (client.remap_wait_seconds, from "
                f"PATHWAYS_REMAP_WAIT_SECONDS): no live island has had {self.size} free "
                f"{self.platform} devices for it. Restart or add a host, or release slices "
                "(client.status() shows what is free)",
                slice=self.name,
                host=self.host,
            ) from None

    def put(self, value: Any, spec: Any = None) -> Any:
        """Send ``value`` to this slice's host: a RemoteArray for an array (array-like,
        or a typed PRNG key array), the same pytree of RemoteArrays for a dict or other
        pytree of arrays (``{"w": w, "b": b}``, a named tuple, a registered node).

        ``spec`` is a PartitionSpec over this slice's mesh axes, for every leaf, or a
        pytree of them matching ``value`` (a prefix of it, as ``jax.device_put`` takes
        shardings); None replicates. A list or tuple is one array-like, as
        ``np.asarray`` reads it. The bytes go straight to the host, never through the
        controller; a RemoteArray already on a slice moves host to host (or is resharded
        on its own slice), as ``jax.device_put`` moves a ``jax.Array``. On a lost slice it
        waits for the remap, for up to ``client.remap_wait_seconds``, then raises
        DataLossError.

        >>> params = vs.put({"w": np.ones((8, 4)), "b": np.zeros(4)}, {"w": P("data"), "b": P()})
        """
        if not _is_tree(value):
            return self._client._put(self, value, spec)
        import jax
        from jax.sharding import PartitionSpec

        def is_spec(s: Any) -> bool:
            return s is None or isinstance(s, PartitionSpec)

        def put_under(s: Any, sub: Any) -> Any:
            return jax.tree.map(lambda v: self._client._put(self, v, s), sub)

        if is_spec(spec):
            return put_under(spec, value)
        try:
            return jax.tree.map(put_under, spec, value, is_leaf=is_spec)
        except ValueError as exc:
            raise ValueError(
                "put's spec must be one PartitionSpec for every leaf or a pytree of them "
                f"matching the value's structure; {exc}"
            ) from None

    def check_axes(self, spec: PartitionSpec) -> None:
        """Raise ValueError unless every mesh axis ``spec`` names is one of this slice's."""
        for entry in spec:
            for a in entry_axes(entry):
                if a not in self.mesh_shape:
                    raise ValueError(
                        f"PartitionSpec {spec} names axis {a!r}, but slice {self.name!r} has axes "
                        f"{list(self.mesh_shape)}"
                    )

    def check_spec(self, spec: PartitionSpec, shape: Sequence[int]) -> None:
        """Raise ValueError unless ``spec`` can shard an array of ``shape`` on this slice."""
        if len(spec) > len(shape):
            raise ValueError(
                f"PartitionSpec {spec} has {len(spec)} entries but the array has rank "
                f"{len(shape)}: give at most one entry per dimension"
            )
        self.check_axes(spec)
        for dim, entry in enumerate(spec):
            n = 1
            for a in entry_axes(entry):
                n *= self.mesh_shape[a]
            if shape[dim] % n:
                raise ValueError(
                    f"dimension {dim} of size {shape[dim]} does not split evenly over {n} devices "
                    f"({spec} on mesh {self.mesh_shape}): pad it to a multiple of {n}, shard "
                    "another dimension, or leave this one unsharded (None in its place)"
                )

    def sharding(self, spec: PartitionSpec) -> Any:
        """``NamedSharding`` of ``spec`` over this slice's abstract mesh."""
        from jax.sharding import NamedSharding

        return NamedSharding(self.abstract_mesh, spec)

    def release(self) -> None:
        """Free the slice's devices; its arrays are deleted. Releasing twice is a no-op.
        A lost slice released is not remapped."""
        if self.state in ("active", "lost"):
            self._client._release(self)

    def __reduce__(self) -> Any:
        # A Dask task that captured the slice would otherwise fail deep in pickle, on
        # the client's lock.
        raise TypeError(
            f"a VirtualSlice cannot be pickled: slice {self.name!r} is this client's "
            "allocation, used from the process that holds the client. To compute data for "
            "it in Dask, put the Dask collection on it (vs.put(dask_array, spec), or "
            "pw.data.batches): its partitions are computed on the slice's own worker"
        )

    def __enter__(self) -> VirtualSlice:
        self.check_active()
        self._previous.append(self._client.default_slice)
        self._client.default_slice = self
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.default_slice = self._previous.pop()


def _is_tree(value: Any) -> bool:
    """Whether ``put`` takes ``value`` as a pytree of arrays rather than one array:
    a dict or another pytree node, but not an array, and not a list or tuple of numbers
    and arrays (an array-like, to NumPy). A list or tuple holding a dict, a named tuple
    or another container of that kind (an optimizer's state, a list of layers' parameters)
    is a pytree, as for ``jax.device_put``."""
    if isinstance(value, dict):
        return True
    if type(value) in (list, tuple):
        return any(_is_tree(v) or v is None for v in value)
    if hasattr(value, "__array__") or hasattr(value, "dtype"):
        return False
    import jax

    leaves = jax.tree.leaves(value)
    return not (len(leaves) == 1 and leaves[0] is value)
