"""Device arrays read into host memory, and host arrays placed onto devices.

``np.asarray`` on a sharded ``jax.Array`` rebuilds its shard bookkeeping on every call
(about 100 µs for four small shards on a CPU host, most of a small fetch's time on the
host). The layout of a (sharding, shape) pair never changes, so it is worked out once
and cached here; each read is then one host copy per distinct region. Placing goes the
other way with the same cache: a put or an arriving transfer becomes one call to XLA's
placement, without ``jax.device_put``'s per-call Python.
"""

from __future__ import annotations

from typing import Any

import jax
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


# XLA's own placement call, under JAX's public ``device_put`` and ``make_array_*``: it
# places one host array per device in one call, without their Python bookkeeping.
try:
    from jax._src.core import ShapedArray as _ShapedArray
    from jax._src.lib import xla_client as _xc

    _batched_device_put: Any = getattr(_xc, "batched_device_put", None)
except ImportError:  # pragma: no cover - a JAX that moved them
    _batched_device_put = None

_PLACEMENTS: dict[tuple[Any, tuple[int, ...]], tuple[list[Any], list[Index]]] = {}


def placement(sharding: Any, shape: tuple[int, ...]) -> tuple[list[Any], list[Index]]:
    """The addressable devices of ``sharding`` and the region of an array of ``shape``
    each one holds, in the sharding's device order (worked out once per pair)."""
    key = (sharding, shape)
    found = _PLACEMENTS.get(key)
    if found is not None:
        return found
    where = sharding.addressable_devices_indices_map(shape)
    devices = list(where)
    result = (devices, [normalize(where[d] or (), shape) for d in devices])
    if len(_PLACEMENTS) >= _MAX_LAYOUTS:
        _PLACEMENTS.clear()
    _PLACEMENTS[key] = result
    return result


def from_regions(
    shape: tuple[int, ...], dtype: Any, sharding: Any, regions: dict[Index, np.ndarray]
) -> Any:
    """A ``jax.Array`` of ``shape`` placed by ``sharding``, each device's shard taken
    from ``regions`` (host arrays keyed by region, as :func:`normalize` writes them).

    ``jax.make_array_from_callback`` does the same with ~50 µs more Python per call:
    most of a small transfer's cost on the destination host.
    """
    devices, wanted = placement(sharding, shape)
    for region in wanted:
        data = regions[region]
        if data.shape != tuple(b - a for a, b in region):
            raise ValueError(
                f"the host array for region {region} of an array of shape {shape} has "
                f"shape {data.shape}; expected {tuple(b - a for a, b in region)}"
            )
    dtype = np.dtype(dtype)
    if _batched_device_put is None or jax.dtypes.canonicalize_dtype(dtype) != dtype:
        return jax.make_array_from_callback(
            shape, sharding, lambda index: regions[normalize(index or (), shape)]
        )
    aval = _ShapedArray(shape, dtype)
    return _batched_device_put(aval, sharding, [regions[r] for r in wanted], devices, True)


def from_host(value: np.ndarray, sharding: Any) -> Any:
    """``value`` placed by ``sharding``: what ``jax.device_put(value, sharding)`` makes
    (with ~150 µs less Python for a small array on two devices)."""
    shape = tuple(value.shape)
    regions: dict[Index, np.ndarray] = {}
    for region in placement(sharding, shape)[1]:
        if region not in regions:
            part = value[tuple(slice(a, b) for a, b in region)]
            # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
            regions[region] = part if part.flags.c_contiguous else part.copy(order="C")
    return from_regions(shape, value.dtype, sharding, regions)
