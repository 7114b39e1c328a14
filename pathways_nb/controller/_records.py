"""What the controller remembers about programs and launches."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Program:
    """A program a client sent: its ``jax.export`` bytes (or, of kind ``"python"``, a
    pickled function the host runs itself), sent on to each host once."""

    name: str
    blob: bytes
    nin: int
    nout: int
    in_specs: list[Any] = dataclasses.field(default_factory=list)
    # XLA options the hosts compile it with (jax.jit's compiler_options).
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The mesh axis types it was traced with (AxisType names), where any is not Auto.
    axis_types: list[str] = dataclasses.field(default_factory=list)
    kind: str = "xla"


@dataclasses.dataclass
class Launch:
    """A launch from submission until its host acknowledges it."""

    tenant: int
    pid: str
    name: str
    slice: str
    island: str
    host: str
    outs: list[int]
    submitted: float
