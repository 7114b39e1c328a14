"""Device arrays read into host memory, one copy per distinct shard.

``np.asarray`` on a sharded ``jax.Array`` rebuilds its shard bookkeeping on every call
(about 100 µs for four small shards on a CPU host, most of a small fetch's time on the
host). The layout of a (sharding, shape) pair never changes, so it is worked out once
and cached here; each read is then one host copy per distinct region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Index = tuple[tuple[int, int], ...]  # (start, stop) per dimension
Layout = tuple[tuple[int, Index], ...]


def normalize(index: tuple[Any, ...], shape: tuple[int, ...]) -> Index:
    """A JAX shard's ``index`` (a tuple of slices) as ``(start, stop)`` pairs."""
    out = []
    for d, n in enumerate(shape):
        s = index[d] if d < len(index) else slice(None)
        start, stop, _ = s.indices(n)
        out.append((start, stop))
    return tuple(out)


_LAYOUTS: dict[tuple[Any, tuple[int, ...]], Layout] = {}
_MAX_LAYOUTS = 4096


def layout(value: Any) -> Layout:
    """``(position, region)`` of the first addressable shard of each distinct region,
    where ``value.addressable_data(position)`` is that shard.

    JAX keeps an array's shards in its sharding's addressable-device order (its own
    ``np.asarray`` relies on it), so one layout serves every array of a (sharding,
    shape) pair.
    """
    shape = tuple(value.shape)
    key = (value.sharding, shape)
    found = _LAYOUTS.get(key)
    if found is not None:
        return found
    where = value.sharding.devices_indices_map(shape)
    seen: set[Index] = set()
    out = []
    for i in range(len(value.sharding.addressable_devices)):
        region = normalize(where[value.addressable_data(i).device], shape)
        if region not in seen:
            seen.add(region)
            out.append((i, region))
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    _LAYOUTS[key] = result = tuple(out)
    return result


def host_shards(value: Any) -> list[tuple[Index, np.ndarray]]:
    """One ``(region, host array)`` per distinct region of ``value``'s addressable shards.

    The host arrays may share memory with the device buffers (CPU devices): copy before
    writing to them.
    """
    shape = tuple(value.shape)
    if value.is_fully_replicated:
        return [(tuple((0, n) for n in shape), np.asarray(value.addressable_data(0)))]
    return [(region, np.asarray(value.addressable_data(i))) for i, region in layout(value)]


def to_numpy(value: Any) -> np.ndarray:
    """``value``'s contents as one C-contiguous NumPy array of its global shape."""
    if value.is_fully_replicated:
        return np.asarray(value.addressable_data(0), order="C")
    shards = host_shards(value)
    out = np.empty(tuple(value.shape), value.dtype)
    for region, data in shards:
        out[tuple(slice(a, b) for a, b in region)] = data
    return out
