"""The ahead-of-time stages of a pw.jit function (``f.trace(...)``, ``f.lower(...)``),
as JAX's own, for the slice's abstract mesh."""

from __future__ import annotations

from collections.abc import Callable
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

    def __init__(
        self, name: str, traced: Any, platform: str, compile_on_slice: Callable[[Any], Any]
    ) -> None:
        super().__init__(name, traced)
        self._platform = platform
        self._compile_on_slice = compile_on_slice

    def lower(self) -> Lowered:
        with interrupts_held():
            lowered = self._inner.lower(lowering_platforms=(self._platform,))
        return Lowered(self._name, lowered, self._compile_on_slice)


class Lowered(_Stage):
    """What ``jax.jit(...).lower`` gives (``as_text()``, ``compiler_ir()``,
    ``cost_analysis()``, ...), lowered for the slice's abstract mesh. :meth:`compile`
    compiles it on the slice's host: the client has no devices to compile for."""

    _stage = "lowered"

    def __init__(self, name: str, lowered: Any, compile_on_slice: Callable[[Any], Any]) -> None:
        super().__init__(name, lowered)
        self._compile_on_slice = compile_on_slice

    def compile(self, compiler_options: dict[str, Any] | None = None) -> Any:
        """Compile on the slice's host, as the first call would (with these XLA options
        added to the function's): a ``Compiled`` whose ``memory_analysis()``,
        ``cost_analysis()`` and ``as_text()`` are the host compiler's; calling it runs
        the function there."""
        return self._compile_on_slice(compiler_options)
