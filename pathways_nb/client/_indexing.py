"""Indexes of small programs on a RemoteArray's slice: what is fixed in the program (by
a stable key), and where RemoteArrays in the index are its arguments."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathways_nb.client._remote import RemoteArray, _is_numpy_dtype


def static_key(value: Any) -> str:
    """A stable text key for a value fixed in a small program (an index, an axis, a
    shape, a NumPy array by its contents); TypeError for what cannot be one."""
    if value is None or value is Ellipsis or isinstance(value, bool | int | float | complex | str):
        return repr(value)  # repr tells 0.0 from -0.0
    if isinstance(value, slice):
        return f"{static_key(value.start)}:{static_key(value.stop)}:{static_key(value.step)}"
    if isinstance(value, tuple | list):
        inner = ",".join(static_key(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    # Before arrays: NumPy's scalar types (np.float32) have an __array__ attribute too.
    if isinstance(value, np.dtype | type):
        return np.dtype(value).name
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__"):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"a {arr.dtype} array cannot be fixed in a program")
        digest = hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]
        return f"array{arr.dtype.str}{arr.shape}{digest}"
    raise TypeError(f"a {type(value).__name__} cannot be fixed in a program")


def split_index(index: Any, shape: tuple[int, ...]) -> tuple[str, Any, list[RemoteArray]]:
    """An index into an array of ``shape`` as (key, the index with each RemoteArray in
    it replaced by its position among the returned arrays, those arrays). NumPy arrays
    stay in the index (fixed in the program by their contents); RemoteArrays are its
    arguments."""
    parts = index if isinstance(index, tuple) else (index,)
    arrays: list[RemoteArray] = []
    fixed: list[Any] = []
    keys: list[str] = []
    dims = _first_dims(parts, len(shape))
    for n, p in enumerate(parts):
        if isinstance(p, RemoteArray) and _is_numpy_dtype(p.dtype) and p.dtype == np.bool_:
            if not p.ndim:
                # A 0-d mask adds an axis of length 1 or 0, as True or False does: its
                # value decides the shape, so it is read.
                flag = bool(np.asarray(p))
                fixed.append(flag)
                keys.append(repr(flag))
                continue
            # The result's shape depends on the mask's values, which a program cannot
            # leave open: read the mask, as a jax.Array index reads a concrete one, and
            # index with where it is true (NumPy's meaning of a mask), put on its slice
            # so that one program serves every mask with as many true entries.
            covered = shape[dims[n] : dims[n] + p.ndim]
            if p.shape != covered:
                raise IndexError(
                    f"boolean index did not match shape of indexed array in index {n}: got "
                    f"{p.shape}, expected {covered} (a mask covers as many dimensions as it "
                    "has, each as long as the array's)"
                )
            for where in np.nonzero(np.asarray(p)):
                fixed.append(Dynamic(len(arrays)))
                keys.append(f"remote{len(arrays)}")
                arrays.append(p.slice.put(where.astype(np.int32)))
            continue
        if isinstance(p, RemoteArray):
            fixed.append(Dynamic(len(arrays)))
            keys.append(f"remote{len(arrays)}")
            arrays.append(p)
            continue
        try:
            keys.append(static_key(p))
        except TypeError:
            raise TypeError(
                "a RemoteArray index takes ints, slices, None, Ellipsis, NumPy arrays of "
                f"ints or bools, and RemoteArrays; got {type(p).__name__}"
            ) from None
        fixed.append(p)
    rebuilt: Any = tuple(fixed) if isinstance(index, tuple) or len(fixed) != 1 else fixed[0]
    return ",".join(keys), rebuilt, arrays


def _first_dims(parts: Sequence[Any], ndim: int) -> list[int]:
    """The first dimension of the indexed array each part of an index applies to: None
    adds one (and takes none), a mask takes as many as it has, an Ellipsis what the
    others leave, anything else one."""

    def takes(p: Any) -> int:
        if p is None or p is Ellipsis:
            return 0
        if getattr(p, "dtype", None) == np.bool_:
            return int(np.ndim(p))
        return 1

    rest = ndim - sum(takes(p) for p in parts)
    out, at = [], 0
    for p in parts:
        out.append(at)
        at += max(rest, 0) if p is Ellipsis else takes(p)
    return out


class Dynamic:
    """A RemoteArray's place in an index, filled with its value inside the program."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


def fill_index(index: Any, values: Sequence[Any]) -> Any:
    """``index`` with each :class:`Dynamic` place filled from ``values``."""
    if isinstance(index, tuple):
        return tuple(values[p.position] if isinstance(p, Dynamic) else p for p in index)
    return values[index.position] if isinstance(index, Dynamic) else index
