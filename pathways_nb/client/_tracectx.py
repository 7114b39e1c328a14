"""The JAX settings a trace depends on, as part of the program cache's key.

``jax.jit`` traces a function again when a setting that changes what it traces to differs
from the last call's (``jax_enable_x64``, ``jax.numpy_dtype_promotion``,
``jax.numpy_rank_promotion``, ``jax.default_matmul_precision``, the context mesh, ...):
its caches key on the calling thread's trace context. ``pw.jit`` keys on the same, so a
call under another setting gets a program traced under it, not one traced before it
changed. The trace context is private to JAX; where a version lacks it, the public
settings that change a trace most stand in.

The NaN and infinity flags change no trace; :func:`output_checks` reads them for each
launch, whose host then checks its outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from pathways_nb._core import CHECK_INFS, CHECK_NANS

# Typed loosely: its flags are attributes made at run time.
_CONFIG: Any = jax.config


def _public_settings() -> tuple[Any, ...]:
    return (
        _CONFIG.jax_enable_x64,
        _CONFIG.jax_numpy_dtype_promotion,
        _CONFIG.jax_numpy_rank_promotion,
        _CONFIG.jax_default_matmul_precision,
    )


def _find() -> Callable[[], Any]:
    try:
        from jax._src import config
    except ImportError:
        return _public_settings
    found = getattr(config, "trace_context", None)
    return found if callable(found) else _public_settings


trace_context: Callable[[], Any] = _find()


def output_checks() -> int:
    """What ``jax_debug_nans`` / ``jax_debug_infs`` in this thread ask each launch's host
    to check its outputs for (``CHECK_NANS | CHECK_INFS``), as jax.jit checks its own."""
    return (CHECK_NANS if _CONFIG.jax_debug_nans else 0) | (
        CHECK_INFS if _CONFIG.jax_debug_infs else 0
    )
