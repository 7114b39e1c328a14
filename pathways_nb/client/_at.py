"""``RemoteArray.at``: indexed updates (``x.at[i].set(v)``), as ``jax.Array.at`` has them,
each a small program that makes a new array on the array's slice."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathways_nb.client._remote import RemoteArray


class At:
    """``RemoteArray.at``: indexed updates, each a new array made on the slice."""

    __slots__ = ("_x",)

    def __init__(self, x: RemoteArray) -> None:
        self._x = x

    def __getitem__(self, index: Any) -> AtIndex:
        return AtIndex(self._x, index)


class AtIndex:
    __slots__ = ("_index", "_x")

    def __init__(self, x: RemoteArray, index: Any) -> None:
        self._x = x
        self._index = index

    def _update(self, how: str, *args: Any, **kwargs: Any) -> RemoteArray:
        return self._x._client._method(self._x, how, (self._index,), args, kwargs)

    def set(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("set", values, **kwargs)

    def add(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("add", values, **kwargs)

    def multiply(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("multiply", values, **kwargs)

    def divide(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("divide", values, **kwargs)

    def power(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("power", values, **kwargs)

    def min(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("min", values, **kwargs)

    def max(self, values: Any, **kwargs: Any) -> RemoteArray:
        return self._update("max", values, **kwargs)

    def get(self, **kwargs: Any) -> RemoteArray:
        return self._update("get", **kwargs)

    def apply(self, func: Callable[[Any], Any], **kwargs: Any) -> RemoteArray:
        """``func`` (elementwise, such as ``jnp.sin``) applied where the index points, as
        ``jax.Array.at[...].apply``. A function has no stable key to cache a program by,
        so each call traces its own."""
        from pathways_nb.client._indexing import fill_index, split_index
        from pathways_nb.client._jit import jit

        if not callable(func):
            raise TypeError(
                f"at[...].apply takes a function of one array (such as jnp.sin); got "
                f"{type(func).__name__} {func!r}"
            )
        key, fixed, arrays = split_index(self._index, self._x.shape)

        def fn(a: Any, *dyn: Any) -> Any:
            return a.at[fill_index(fixed, dyn)].apply(func, **kwargs)

        name = f"at[{key}].apply({getattr(func, '__name__', 'fn')})"
        out: RemoteArray = jit(fn, slice=self._x.slice, name=name)(self._x, *arrays)
        return out
