"""What JAX says when it is handed a RemoteArray outside ``pw.jit``.

``jax.jit(f)(x)``, ``jnp.sin(x)`` and ``jax.device_put(x)`` ask JAX's table of Python
types what abstract value ``x`` is. A type missing from it gets "Argument '<value>' is
not a valid JAX type", whose ``<value>`` is ``str(x)``: for a RemoteArray that fetches
the array, only to say nothing of what to do. Listing RemoteArray there with a function
that raises makes the same calls fail at once, without a fetch, with a message that says
where the array lives and how to run ``f`` on it. It is a ValueError, as JAX's own for
objects it will not convert in that table (those with ``__jax_array__``): ``jax.jit``
turns a TypeError from there into its advice to mark the argument static. The table is
private to JAX: where a JAX version lacks it, JAX's own error stays.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(x: Any) -> NoReturn:
    where = f"slice {x.slice.name!r}" if getattr(x, "slice", None) is not None else "a slice"
    raise ValueError(
        f"a pathways_nb RemoteArray (shape {tuple(x.shape)}, {x.dtype}) lives on {where} of "
        "the cluster, not in this process, so jax.jit, jax.numpy and jax.device_put cannot "
        "take it. Run the function on its slice with pw.jit (pw.jit(f)(x) where you wrote "
        "jax.jit(f)(x), pw.jit(jnp.sin)(x) for jnp.sin(x)), or fetch the value here first "
        "(x.fetch(), np.asarray(x))"
    )


def refuse_in_jax(cls: type) -> bool:
    """List ``cls`` in JAX's type table with :func:`_refuse`; False where JAX has no
    such table."""
    try:
        from jax._src import core
    except ImportError:
        return False
    table = getattr(core, "pytype_aval_mappings", None)
    if not isinstance(table, dict):
        return False
    table[cls] = _refuse
    return True
