"""Where a RemoteArray's parts are: which virtual device holds which part, as a
``jax.Array``'s ``devices()``, ``addressable_shards`` and ``to_device`` say and do for an
array in this process."""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any

from pathways_nb._core import encode_mesh, encode_spec, shard_indices

if TYPE_CHECKING:
    import numpy as np
    from jax.sharding import NamedSharding

    from pathways_nb.client._remote import RemoteArray
    from pathways_nb.client._slice import VirtualDevice, VirtualSlice


@dataclasses.dataclass(frozen=True, eq=False)
class RemoteShard:
    """One virtual device's part of a RemoteArray, as a ``jax.Shard`` is of a ``jax.Array``.

    ``index`` is the tuple of slices of the global array the device holds (``slice(None)``
    for a dimension it holds whole, as in JAX); ``replica_id`` counts the devices before it
    that hold the same part. Unlike a ``jax.Shard``, whose ``data`` is an array on its
    device, ``data`` here is the part's values read from the host, as NumPy.
    """

    device: VirtualDevice
    index: tuple[slice, ...]
    replica_id: int
    array: RemoteArray

    @property
    def data(self) -> np.ndarray:
        """The part's values, read from the host now (only its own bytes travel)."""
        if all(s == slice(None) for s in self.index):
            return self.array.fetch()
        return self.array[self.index].fetch()

    def __repr__(self) -> str:
        return (
            f"RemoteShard(device={self.device!r}, index={self.index}, replica_id={self.replica_id})"
        )


class Placement:
    """Where a RemoteArray's parts are, as a ``jax.Array`` says it of its own: a base of
    :class:`~pathways_nb.client.RemoteArray`."""

    __slots__ = ()
    slice: VirtualSlice
    sharding: NamedSharding
    spec: Any

    def devices(self) -> set[VirtualDevice]:
        """The virtual devices of the array's slice, each naming the host device it is
        on (``jax.Array.devices()`` gives the physical devices themselves)."""
        return set(self.slice.virtual_devices)

    @property
    def addressable_shards(self) -> list[RemoteShard]:
        """Each virtual device's part of the array: its device, the index of the part
        and its replica id, as ``jax.Array.addressable_shards``; a shard's ``data`` is
        read from the host when asked. The client addresses every device of its slices,
        so these are also the ``global_shards``."""
        return shards_of(self)

    def addressable_data(self, index: int) -> np.ndarray:
        """Shard ``index``'s values (see :attr:`addressable_shards`), read from the host as
        NumPy, where ``jax.Array.addressable_data`` gives an array on that device."""
        return self.addressable_shards[index].data

    def to_device(self, device: Any, *, stream: Any = None) -> RemoteArray:
        """The Array API's ``to_device``: the array on another slice (``device`` a
        VirtualSlice, keeping its PartitionSpec), or laid out by another sharding over
        its own slice's mesh (``device`` a NamedSharding), as ``vs.put(x, spec)`` does."""
        from jax.sharding import NamedSharding

        from pathways_nb.client._slice import VirtualSlice

        if stream is not None:
            raise ValueError(f"to_device takes no stream (got {stream!r}): hosts order copies")
        if isinstance(device, VirtualSlice):
            try:
                device.check_axes(self.spec)
            except ValueError as exc:
                raise ValueError(
                    f"{exc}: {self.spec} is this array's layout on slice "
                    f"{self.slice.name!r}; give one over the new slice's axes with put, "
                    "such as vs.put(x, P()) to replicate it there"
                ) from None
            return device.put(self, self.spec)
        if isinstance(device, NamedSharding) and dict(device.mesh.shape) == dict(
            self.sharding.mesh.shape
        ):
            return self.slice.put(self, device.spec)
        raise TypeError(
            f"to_device takes a VirtualSlice, or a NamedSharding over the slice's mesh "
            f"{dict(self.sharding.mesh.shape)}; got {device!r}. A RemoteArray lives on a "
            "whole slice: to put it on fewer devices, allocate a slice of that size and "
            "pass it."
        )

    @property
    def global_shards(self) -> list[RemoteShard]:
        """The same as :attr:`addressable_shards`."""
        return self.addressable_shards

    @property
    def is_fully_addressable(self) -> bool:
        """True: the client reaches every shard through the hosts."""
        return True


def shards_of(x: Any) -> list[RemoteShard]:
    """Every shard of ``x``, in the slice's device order."""
    vs = x.slice
    regions = shard_indices(x.shape, encode_spec(x.sharding.spec), encode_mesh(vs.mesh_shape))
    seen: collections.Counter[Any] = collections.Counter()
    out = []
    for device, region in zip(vs.virtual_devices, regions, strict=True):
        index = tuple(
            slice(None) if (a, b) == (0, n) else slice(a, b)
            for (a, b), n in zip(region, x.shape, strict=True)
        )
        out.append(RemoteShard(device, index, seen[region], x))
        seen[region] += 1
    return out
