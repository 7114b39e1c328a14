"""The shards of a RemoteArray: which virtual device holds which part, as ``jax.Array``'s
``addressable_shards`` says for an array in this process."""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any

from pathways_nb._core import encode_mesh, encode_spec, shard_indices

if TYPE_CHECKING:
    import numpy as np

    from pathways_nb.client._remote import RemoteArray
    from pathways_nb.client._slice import VirtualDevice


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


def shards_of(x: RemoteArray) -> list[RemoteShard]:
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
