"""What a ``pw.colocated`` call carries to its host, shared by the client that packs it
and the host that unpacks it.

The function travels pickled (``cloudpickle``: a function defined in the notebook goes
by value, one from an installed module by reference) inside a :class:`Payload`: the
call's arguments with a :class:`Slot` where each input array goes, what the function
returns with a :class:`Slot` where each output comes from, and each output's shape,
dtype and PartitionSpec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pathways_nb._core._specs import EncodedSpec

# Bumped when the payload's fields change: a host refuses one it does not know.
PAYLOAD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Slot:
    """Input array ``index`` among a call's arguments, or output ``index`` among what
    the function returns."""

    index: int


@dataclasses.dataclass(frozen=True)
class Payload:
    fn: Callable[..., Any]
    # (args, kwargs) with a Slot for each input array; other values as given.
    arguments: tuple[tuple[Any, ...], dict[str, Any]]
    # What the function returns, with a Slot per output array.
    returns: Any
    # Per output: shape, wire dtype (see _dtypes), encoded PartitionSpec.
    outputs: Sequence[tuple[tuple[int, ...], str, EncodedSpec]]
    version: int = PAYLOAD_VERSION


def is_slot(x: Any) -> bool:
    return isinstance(x, Slot)


def fill(template: Any, values: Sequence[Any]) -> tuple[Any, int]:
    """``template`` with each :class:`Slot` replaced by ``values[slot.index]``, and how
    many were: a Slot inside a pytree type this process has not registered stays hidden
    in a leaf."""
    import jax

    filled = 0

    def value(x: Any) -> Any:
        nonlocal filled
        if not is_slot(x):
            return x
        filled += 1
        return values[x.index]

    return jax.tree.map(value, template, is_leaf=is_slot), filled
