"""RemoteArray: a client handle to a sharded buffer that lives on a host's devices."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_nb._core import ClosedError

if TYPE_CHECKING:
    from jax.sharding import NamedSharding

    from pathways_nb.client._session import Client
    from pathways_nb.client._slice import VirtualSlice


class RemoteArray:
    """A future for an array on a virtual slice; behaves like a ``jax.Array`` where it can.

    Its ``shape``, ``dtype`` and ``sharding`` are known as soon as the program that makes
    it is submitted. Reading its value (``np.asarray(x)``, ``x.fetch()``) waits for it.
    Arithmetic and indexing run small programs on the array's slice.
    """

    __slots__ = (
        "__weakref__",
        "_client",
        "_copies",
        "_deleted",
        "_lid",
        "_ready",
        "_sig",
        "dtype",
        "handle",
        "shape",
        "sharding",
        "slice",
    )

    __array_priority__ = 100

    def __init__(
        self,
        client: Client,
        handle: int,
        shape: tuple[int, ...],
        dtype: Any,
        sharding: NamedSharding,
        slice: VirtualSlice,
        lid: int,
    ) -> None:
        self._client = client
        self.handle = handle
        self.shape = tuple(shape)
        self.dtype = dtype
        self.sharding = sharding
        self.slice = slice
        self._lid = lid
        self._deleted = False
        self._ready = False  # known computed (a fetch or wait returned)
        # Copies moved to other slices, by (slice id, PartitionSpec); made on first use.
        self._copies: dict[Any, RemoteArray] | None = None
        # What pw.jit's program cache keys on; computed once.
        self._sig = (self.shape, dtype, sharding.spec)

    # metadata -------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize if _is_numpy_dtype(self.dtype) else 0

    @property
    def spec(self) -> Any:
        return self.sharding.spec

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        if self._deleted:
            state = "deleted"
        elif self._client._error_of(self) is not None:
            state = "failed"
        else:
            state = "ready" if self.is_ready() else "pending"
        return (
            f"RemoteArray(shape={self.shape}, dtype={_dtype_name(self.dtype)}, "
            f"slice={self.slice.name!r}, spec={self.spec}, {state})"
        )

    # state ----------------------------------------------------------------------------
    def is_ready(self) -> bool:
        """True once the program that makes this array has finished (or failed).

        Known at once after a fetch or wait of it; otherwise from the controller's
        completion notices, which trail the program by up to about 20 ms.
        """
        return self._ready or self._client._is_done(self._lid)

    def is_deleted(self) -> bool:
        return self._deleted

    def block_until_ready(self) -> RemoteArray:
        """Wait until the array is computed; raise its error if its program failed."""
        self._client._wait_ready([self])
        return self

    def fetch(self) -> Any:
        """The value as a NumPy array (a JAX PRNG key array for typed keys)."""
        return self._client.fetch(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self.fetch())
        return out.astype(dtype) if dtype is not None else out

    def item(self) -> Any:
        return np.asarray(self).item()

    def __float__(self) -> float:
        return float(np.asarray(self))

    def __int__(self) -> int:
        return int(np.asarray(self))

    def __bool__(self) -> bool:
        return bool(np.asarray(self))

    def delete(self) -> None:
        """Free the buffers on the host now; using the array afterwards is an error."""
        if not self._deleted:
            self._deleted = True
            self._client._delete_soon(self.handle)

    def __del__(self) -> None:
        try:
            if not self._deleted:
                self._deleted = True
                self._client._delete_soon(self.handle)
        except Exception:  # interpreter shutdown: nothing left to tell
            pass

    def _check_usable(self) -> None:
        if self._deleted:
            raise ClosedError(
                f"this RemoteArray (shape {self.shape}) was deleted or donated; "
                "use the array the program returned instead"
            )

    # small programs on the array's slice -----------------------------------------------
    def __getitem__(self, index: Any) -> RemoteArray:
        return self._client._index(self, index)

    @property
    def T(self) -> RemoteArray:
        return self._client._op("transpose", _transpose, self)

    def astype(self, dtype: Any) -> RemoteArray:
        return self._client._op(f"astype[{np.dtype(dtype).name}]", _astype(np.dtype(dtype)), self)

    def sum(self, axis: Any = None) -> RemoteArray:
        return self._client._op(f"sum[{axis}]", _reduce("sum", axis), self)

    def mean(self, axis: Any = None) -> RemoteArray:
        return self._client._op(f"mean[{axis}]", _reduce("mean", axis), self)

    def reshape(self, *shape: Any) -> RemoteArray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return self._client._op(f"reshape{shape}", _reshape(tuple(shape)), self)


def _dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name if _is_numpy_dtype(dtype) else str(dtype)


def _is_numpy_dtype(dtype: Any) -> bool:
    try:
        np.dtype(dtype)
        return True
    except TypeError:
        return False


def _transpose(x: Any) -> Any:
    return x.T


def _astype(dtype: np.dtype[Any]) -> Callable[[Any], Any]:
    return lambda x: x.astype(dtype)


def _reduce(name: str, axis: Any) -> Callable[[Any], Any]:
    return lambda x: getattr(x, name)(axis=axis)


def _reshape(shape: tuple[int, ...]) -> Callable[[Any], Any]:
    return lambda x: x.reshape(shape)


def _binary(op: Callable[[Any, Any], Any], name: str, reflected: bool) -> Callable[..., Any]:
    def method(self: RemoteArray, other: Any) -> Any:
        def fn(a: Any, b: Any) -> Any:
            return op(b, a) if reflected else op(a, b)

        key = f"{'r' if reflected else ''}{name}"
        return self._client._op(key, fn, self, other)

    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


def _unary(op: Callable[[Any], Any], name: str) -> Callable[..., Any]:
    def method(self: RemoteArray) -> Any:
        return self._client._op(name, op, self)

    method.__name__ = f"__{name}__"
    return method


for _name, _op in {
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
}.items():
    setattr(RemoteArray, f"__{_name}__", _binary(_op, _name, False))
    setattr(RemoteArray, f"__r{_name}__", _binary(_op, _name, True))
for _name, _op in {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}.items():
    setattr(RemoteArray, f"__{_name}__", _binary(_op, _name, False))
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": operator.abs,
    "invert": operator.invert,
}
for _name, _fn in _UNARY.items():
    setattr(RemoteArray, f"__{_name}__", _unary(_fn, _name))


def index_key(idx: Any) -> str:
    """A stable text key for a static index; anything dynamic is refused with advice."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    out = []
    for p in parts:
        if isinstance(p, slice):
            out.append(f"{p.start}:{p.stop}:{p.step}")
        elif p is None or p is Ellipsis or (isinstance(p, int) and not isinstance(p, bool)):
            out.append(repr(p))
        else:
            raise TypeError(
                "RemoteArray indexing takes ints, slices, None and Ellipsis (static indices); "
                f"got {type(p).__name__}. Index inside a pw.jit function for dynamic indices."
            )
    return ",".join(out)
