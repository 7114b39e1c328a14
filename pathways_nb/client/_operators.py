"""The jax.Array operators and array methods of a RemoteArray.

Each runs as a small program on the array's slice (``Client._op`` and ``Client._method``
build, cache and launch it), so ``x + 1``, ``x < y`` and ``x.sum(0)`` return futures at
once, with the dtype and weak type JAX's own operator would give.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pathways_nb.client._remote import RemoteArray

# jax.Array methods that make arrays from arrays: each runs as a small program on the
# array's slice, with its other arguments fixed in the program (RemoteArrays travel).
METHODS = (
    "all",
    "any",
    "argmax",
    "argmin",
    "argpartition",
    "argsort",
    "byteswap",
    "choose",
    "clip",
    "conj",
    "conjugate",
    "copy",
    "cumprod",
    "cumsum",
    "diagonal",
    "dot",
    "flatten",
    "max",
    "mean",
    "min",
    "prod",
    "ptp",
    "ravel",
    "repeat",
    "round",
    "searchsorted",
    "sort",
    "squeeze",
    "std",
    "sum",
    "swapaxes",
    "take",
    "trace",
    "transpose",
    "var",
    "view",
)

# Binary operators with a reflected form (x + 1 and 1 + x); divmod gives two arrays,
# as jax.Array's does.
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
    "divmod": divmod,
}
# Orderings: Python reflects x < y into y > x itself, so these have no __r*__ form.
ORDERINGS: dict[str, Callable[[Any, Any], Any]] = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
# == and != compare elementwise too, and refuse containers as a jax.Array does.
EQUALITY: dict[str, Callable[[Any, Any], Any]] = {"eq": operator.eq, "ne": operator.ne}
UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": operator.abs,
    "invert": operator.invert,
}


def install(cls: type[RemoteArray]) -> None:
    """Give ``cls`` the operators and methods of a jax.Array."""
    for name in METHODS:
        setattr(cls, name, _method(name))
    for name, op in BINARY.items():
        setattr(cls, f"__{name}__", _binary(cls, op, name, reflected=False))
        setattr(cls, f"__r{name}__", _binary(cls, op, name, reflected=True))
    for name, op in ORDERINGS.items():
        setattr(cls, f"__{name}__", _binary(cls, op, name, reflected=False))
    for name, fn in UNARY.items():
        setattr(cls, f"__{name}__", _unary(fn, name))
    for name, op in EQUALITY.items():
        setattr(cls, f"__{name}__", _equality(cls, op, name))


def _method(name: str) -> Callable[..., Any]:
    def method(self: RemoteArray, *args: Any, **kwargs: Any) -> Any:
        return self._client._method(self, name, None, args, kwargs)

    method.__name__ = name
    method.__doc__ = f"``jax.Array.{name}``, run as a small program on the array's slice."
    return method


def _binary(
    cls: type[RemoteArray], op: Callable[[Any, Any], Any], name: str, reflected: bool
) -> Callable[..., Any]:
    key = f"{'r' if reflected else ''}{name}"

    def fn(a: Any, b: Any) -> Any:
        return op(b, a) if reflected else op(a, b)

    def method(self: RemoteArray, other: Any) -> Any:
        if not is_operand(cls, other):
            return NotImplemented
        if name == "pow" and not reflected and _concrete_int(other):
            # jnp.power raises to a concrete integer exponent by repeated multiplication,
            # keeping the base's dtype (int8 ** np.int64(5) is int8): the exponent is
            # fixed in the program, as a Python int is.
            other = int(other)
        return self._client._op(key, fn, self, other)

    method.__name__ = f"__{key}__"
    return method


def _equality(
    cls: type[RemoteArray], op: Callable[[Any, Any], Any], name: str
) -> Callable[..., Any]:
    def method(self: RemoteArray, other: Any) -> Any:
        if not is_operand(cls, other):
            return _not_comparable(self, other)
        return self._client._op(name, op, self, other)

    method.__name__ = f"__{name}__"
    return method


def _unary(op: Callable[[Any], Any], name: str) -> Callable[..., Any]:
    def method(self: RemoteArray) -> Any:
        return self._client._op(name, op, self)

    method.__name__ = f"__{name}__"
    return method


def is_operand(cls: type[RemoteArray], other: Any) -> bool:
    """Whether a jax.Array's operator takes ``other``: arrays and numbers; for anything
    else (a list, a string, None) it returns NotImplemented, and so does a RemoteArray."""
    if isinstance(other, cls | int | float | complex | np.ndarray | np.generic):
        return True
    import jax

    return isinstance(other, jax.Array)


def _not_comparable(x: RemoteArray, other: Any) -> Any:
    """``x == other`` for what no program takes, as a jax.Array answers it: a container
    is refused (not silently unequal); anything else is compared by identity."""
    if type(other) in (dict, list, set, tuple):
        raise TypeError(
            f"unsupported operand type(s) for ==: {type(x).__name__!r} and {type(other).__name__!r}"
        )
    return NotImplemented


def _concrete_int(v: Any) -> bool:
    """Whether ``v`` is a 0-d integer NumPy value or jax.Array (a RemoteArray's value
    is on its slice, so it is not one)."""
    import jax

    if not isinstance(v, np.generic | np.ndarray | jax.Array):
        return False
    return np.ndim(v) == 0 and np.dtype(v.dtype).kind in "iu"
