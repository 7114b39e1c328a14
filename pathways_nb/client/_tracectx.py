"""The JAX settings a trace depends on, as part of the program cache's key.

``jax.jit`` traces a function again when a setting that changes what it traces to differs
from the last call's (``jax_enable_x64``, ``jax.numpy_dtype_promotion``,
``jax.numpy_rank_promotion``, ``jax.default_matmul_precision``, the context mesh, ...):
its caches key on the calling thread's trace context. ``pw.jit`` keys on the same, so a
call under another setting gets a program traced under it, not one traced before it
changed. The trace context is private to JAX; where a version lacks it, the public
settings that change a trace most stand in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

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
