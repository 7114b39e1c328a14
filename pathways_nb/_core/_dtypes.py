"""Array dtypes on the wire.

NumPy's own code for a dtype (``dtype.str``, such as ``<f4``) names every builtin type,
but the types JAX adds from ``ml_dtypes`` (bfloat16, the float8 and int4 families) read
as raw bytes there (``<V2``): decoded, a bfloat16 array would become a void one. Those
travel by name instead, which ``ml_dtypes`` registers with NumPy.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 and friends by name with NumPy)
import numpy as np

from pathways_nb._core._errors import ProtocolError


def encode_dtype(dtype: Any) -> str:
    """The wire name of ``dtype``."""
    dt = np.dtype(dtype)
    # Some ml_dtypes types report a builtin kind and a code NumPy cannot read back
    # (float8_e5m2: kind "f", "<f1"): those go by name too.
    return dt.str if dt.kind in "biufc" and not _from_ml_dtypes(dt) else dt.name


def decode_dtype(name: Any) -> np.dtype[Any]:
    """The dtype a wire name stands for; ProtocolError for anything that is not one
    of the numeric types arrays are made of."""
    try:
        dt = np.dtype(str(name))
    except TypeError:
        dt = None
    if dt is None or not (dt.kind in "biufc" or _from_ml_dtypes(dt)):
        raise ProtocolError(
            f"dtype {name!r} is not a numeric array type; expected a NumPy code such as "
            "'<f4' or an ml_dtypes name such as 'bfloat16'"
        )
    return dt


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous ``array``, without a copy, as one frame. Python's
    buffer protocol has no code for the ``ml_dtypes`` types, so the array is viewed as
    bytes first (``memoryview(array.data)`` refuses a bfloat16 array)."""
    return array.reshape(-1).view(np.uint8).data


def _from_ml_dtypes(dt: np.dtype[Any]) -> bool:
    return str(getattr(dt.type, "__module__", "")).split(".")[0] == "ml_dtypes"
