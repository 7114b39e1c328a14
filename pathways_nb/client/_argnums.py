"""Which of a pw.jit function's arguments are static or donated: positions and names
resolved through its signature, as jax.jit resolves them."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np


def norm_argnums(x: int | Sequence[int] | None, what: str = "argnums") -> tuple[int, ...]:
    if x is None:
        return ()
    items = (x,) if isinstance(x, int | np.integer) else x
    if isinstance(items, str) or not all(
        isinstance(i, int | np.integer) and not isinstance(i, bool) for i in items
    ):
        raise TypeError(
            f"{what} takes argument positions (an int or a sequence of ints); got {x!r}"
            + (f" (for parameter names, use {what[:-4]}names)" if isinstance(x, str) else "")
        )
    return tuple(int(i) for i in items)


def argnums_and_names(
    signature: inspect.Signature | None,
    name: str,
    argnums: int | Sequence[int] | None,
    argnames: str | Sequence[str] | None,
    what: str,
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The static or donated (``what``) positions and names of function ``name``. As in
    jax.jit, either one given alone implies the other through the function's signature,
    so an argument is static (or donated) whether passed by position or by keyword."""
    nums = norm_argnums(argnums, f"{what}_argnums")
    names = (argnames,) if isinstance(argnames, str) else tuple(argnames or ())
    params = list(signature.parameters.values()) if signature else []
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    takes_args = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    if nums and signature is not None and not takes_args:
        # As jax.jit: positions are checked against the signature, and a negative
        # one counts from the end of its positional parameters.
        beyond = [i for i in nums if not -len(positional) <= i < len(positional)]
        if beyond:
            raise ValueError(
                f"{what}_argnums={nums} names position {beyond[0]}, but {name} takes "
                f"{len(positional)} positional arguments ({', '.join(positional)})"
            )
        nums = tuple(i % len(positional) for i in nums)
    if names and signature is not None and not takes_kwargs:
        known = {p.name for p in params if p.kind != inspect.Parameter.POSITIONAL_ONLY}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"{what}_argnames names {unknown[0]!r}, which {name} does not take "
                f"by keyword; its parameters are ({', '.join(p.name for p in params)})"
            )
    if names and argnums is None:
        nums = tuple(i for i, n in enumerate(positional) if n in names)
    if nums and argnames is None:
        names = tuple(positional[i] for i in nums if i < len(positional))
    return nums, names
