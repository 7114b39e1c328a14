"""NaN and infinity checks of a launch's outputs, for clients that set ``jax_debug_nans``
or ``jax_debug_infs``.

``jax.jit`` checks a program's outputs under those flags and raises ``FloatingPointError``
before anything uses them. The flags live in the client's process, so the client marks
each launch made under them (``check``: ``CHECK_NANS | CHECK_INFS``), and the host checks
that launch's floating outputs with one small program on the same devices. The
dispatching thread waits for that check before it stores the outputs, so no later
launch reads them first: a failed check becomes the outputs' error, and every consumer
fails with it, as with any other failed program. The inputs are checked in the same
program, so the error says whether the values came in with them.

The hosts' own threads run with JAX's checks off (see :mod:`pathways_nb.worker._threads`):
a flag set in the host's process (an in-process cluster shares the client's,
``JAX_DEBUG_NANS`` may be in a worker's environment) would otherwise fail every tenant's
programs with JAX's internal exception instead of this check, and only for the tenants
that asked for it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pathways_nb._core import CHECK_INFS as INFS
from pathways_nb._core import CHECK_NANS as NANS
from pathways_nb._core import NonFiniteError

_WHAT = {NANS: "NaN", INFS: "inf"}


@functools.partial(jax.jit, static_argnums=0)
def _flags(bits: int, xs: list[jax.Array]) -> jax.Array:
    rows = [
        jnp.stack(
            [
                jnp.isnan(x).any() if bits & NANS else jnp.bool_(False),
                jnp.isinf(x).any() if bits & INFS else jnp.bool_(False),
            ]
        )
        for x in xs
    ]
    return jnp.stack(rows)


def _checked(values: Sequence[Any]) -> list[int]:
    """Indices of the values a check looks at: live floating and complex arrays."""
    return [
        i
        for i, v in enumerate(values)
        if isinstance(v, jax.Array)
        and jnp.issubdtype(v.dtype, jnp.inexact)
        and not v.is_deleted()
        and v.size
    ]


def _bad(bits: int, values: Sequence[Any]) -> list[tuple[int, str]]:
    """(index, "NaN" or "inf") of each value holding one; waits for the values."""
    idx = _checked(values)
    if not idx:
        return []
    # JAX's own check is off on host threads (see _threads), so it cannot fail this one.
    flags = np.asarray(_flags(bits, [values[i] for i in idx]))
    found = []
    for i, (nan, inf) in zip(idx, flags, strict=True):
        if nan or inf:
            found.append((i, _WHAT[NANS] if nan else _WHAT[INFS]))
    return found


def _described(i: int, x: Any, what: str) -> str:
    return f"{i} ({x.dtype}{list(x.shape)}) holds {what}"


def nonfinite(
    bits: int,
    args: Sequence[Any],
    outputs: Sequence[Any],
    program: str,
    slice: str,
    host: str,
) -> NonFiniteError | None:
    """The error for a launch whose floating outputs hold NaN (or inf, as ``bits`` ask),
    else None. Waits until the launch has run."""
    out_bad = _bad(bits, outputs)
    if not out_bad:
        return None
    flags = " and ".join(
        name for bit, name in ((NANS, "jax_debug_nans"), (INFS, "jax_debug_infs")) if bits & bit
    )
    outs = "; ".join(f"output {_described(i, outputs[i], w)}" for i, w in out_bad)
    in_bad = _bad(bits, args)
    if in_bad:
        came = "; its inputs already did: " + "; ".join(
            f"input {_described(i, args[i], w)}" for i, w in in_bad
        )
    else:
        came = "; its inputs held none, so the program made them"
    return NonFiniteError(
        f"{outs} ({flags} set in the client){came}. To find the operation, fetch the "
        f"inputs and run the function under jax.jit with the same flag set: JAX then runs "
        f"it op by op and names the one",
        program=program,
        slice=slice,
        host=host,
    )
