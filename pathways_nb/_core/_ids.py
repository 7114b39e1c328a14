"""Client-generated handles.

As in XLA's IFRT proxy, the client names every remote array and launch itself, so
submitting never waits for a reply. A handle is one 64-bit integer: the tenant id
the controller assigned at connect in the high bits, a per-client counter below.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

TENANT_SHIFT = 40
_COUNTER_MASK = (1 << TENANT_SHIFT) - 1


def handle_owner(handle: int) -> int:
    """The tenant id that created ``handle``."""
    return handle >> TENANT_SHIFT


def program_id(
    blob: bytes,
    key: bytes,
    options: Mapping[str, Any] | None = None,
    axis_types: Sequence[str] = (),
    kind: str = "xla",
) -> str:
    """A program's id: the digest of its bytes (a ``jax.export`` artifact, or for
    ``kind="python"`` a pickled Python function, see ``pw.colocated``), ``key`` (what
    else tells two programs of the same bytes apart), and the compiler options and mesh
    axis types its hosts compile it with. The controller checks it against what a
    program message carries, so an id names those alone: no client can send other
    bytes, options, axis types or kind under the id of a program another client runs."""
    if kind != "xla":
        key += b"\0kind" + kind.encode()
    if options:
        key += b"\0options" + json.dumps(dict(options), sort_keys=True).encode()
    if axis_types:
        key += b"\0axis_types" + json.dumps(list(axis_types)).encode()
    return hashlib.sha256(blob + key).hexdigest()[:24]


# What a program's bytes are: a jax.export artifact the host compiles, a pickled
# Python function it calls (pw.colocated), or StableHLO with XLA's compile options,
# which plain JAX compiled through the IFRT proxy (pathways_nb.proxy).
PROGRAM_KINDS = ("xla", "python", "hlo")

# The names of jax.sharding.AxisType's members, as programs carry them on the wire.
AXIS_TYPES = ("Auto", "Explicit", "Manual")


def axis_type_names(value: Any) -> list[str]:
    """A program message's ``axis_types``: a list of AxisType names; TypeError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(v in AXIS_TYPES for v in value):
        raise TypeError(f"axis_types lists mesh axis types among {AXIS_TYPES}; got {value!r}")
    return list(value)


# What an XLA compiler option's value may be (as jax.jit's compiler_options takes them).
_OPTION_TYPES = (bool, int, float, str)


def compiler_options(options: Any) -> dict[str, bool | int | float | str]:
    """``options`` checked as ``jax.jit``'s ``compiler_options``: a dict of XLA option
    names to booleans, numbers or strings; TypeError saying what is wrong otherwise."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            "compiler_options is a dict of XLA option names to values, as jax.jit takes it "
            f"(e.g. {{'xla_cpu_enable_fast_math': True}}); got {type(options).__name__}"
        )
    out: dict[str, bool | int | float | str] = {}
    for name, value in options.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"compiler_options names options by string; got {name!r}")
        if not isinstance(value, _OPTION_TYPES):
            raise TypeError(
                f"compiler_options[{name!r}] is a boolean, number or string; got "
                f"{type(value).__name__} {value!r}"
            )
        out[name] = value
    return out


def foreign(handles: Sequence[object], tenant: int) -> object | None:
    """The first of ``handles`` that is not an id ``tenant`` made (not an integer, or
    another tenant's), or None if all are its own. A client's messages name only its own
    arrays and launches; one that names another tenant's is refused, so no client can
    read, overwrite, fail or delete another's work."""
    for h in handles:
        if type(h) is not int or h >> TENANT_SHIFT != tenant:
            return h
    return None


def describe_foreign(what: str, h: object, tenant: int) -> str:
    """Why ``h``, found by :func:`foreign`, is refused."""
    if type(h) is not int:
        return f"{what} {h!r} is not an integer id"
    return (
        f"{what} {h:#x} belongs to tenant {handle_owner(h)}, not to this client "
        f"(tenant {tenant}): a client names only the arrays and launches it made"
    )


class HandleAllocator:
    """Hands out unique ids for one tenant; thread-safe."""

    def __init__(self, tenant: int) -> None:
        if not 0 < tenant < (1 << 23):
            raise ValueError(f"tenant id must be in [1, 2**23), got {tenant}")
        self._base = tenant << TENANT_SHIFT
        # next() on an itertools.count is one C call: atomic under the GIL, no lock needed.
        self._counter = itertools.count(1)

    def next(self) -> int:
        n = next(self._counter)
        if n > _COUNTER_MASK:
            raise OverflowError("this client has used every handle id; reconnect")
        return self._base | n


def donated_twice(handles: Sequence[int], donate: Sequence[int]) -> tuple[int, int] | None:
    """``(position, count)`` of the first donated input that the same launch also takes
    at another position, or None. Such a launch would read a buffer XLA may overwrite
    (and XLA's CPU client ends the process on it): the client and hosts refuse it."""
    if len(set(handles)) == len(handles):
        return None
    for i in donate:
        count = handles.count(handles[i])
        if count > 1:
            return i, count
    return None
