"""The ahead-of-time stages of a pw.jit function (``f.trace(...)``, ``f.lower(...)``),
as JAX's own, for the slice's abstract mesh."""

from __future__ import annotations

from typing import Any

from pathways_nb.client._interrupts import interrupts_held


class _Stage:
    """One of JAX's ahead-of-time stages of a pw.jit function, for the slice's abstract
    mesh: JAX's own object answers every attribute this one does not define."""

    _stage = ""

    def __init__(self, name: str, inner: Any) -> None:
        self._name = name
        self._inner = inner

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    def __repr__(self) -> str:
        return f"<pw.jit {self._name} {self._stage}: {self._inner!r}>"


class Traced(_Stage):
    """What ``jax.jit(...).trace`` gives (``jaxpr``, ``out_info``, ...), traced for the
    slice's abstract mesh; :meth:`lower` lowers it for the slice's platform."""

    _stage = "traced"

    def __init__(self, name: str, traced: Any, platform: str) -> None:
        super().__init__(name, traced)
        self._platform = platform

    def lower(self) -> Lowered:
        with interrupts_held():
            lowered = self._inner.lower(lowering_platforms=(self._platform,))
        return Lowered(self._name, lowered)


class Lowered(_Stage):
    """What ``jax.jit(...).lower`` gives (``as_text()``, ``compiler_ir()``,
    ``cost_analysis()``, ...), lowered for the slice's abstract mesh. It is compiled
    on the slice's host, once per device assignment, at the first call: the client
    has no devices to compile for."""

    _stage = "lowered"

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self._name} compiles on its slice's host, not in the client (which has no "
            "devices for the slice's mesh): call the function to run it there, or read "
            "this lowering with as_text(), compiler_ir() or cost_analysis()"
        )
