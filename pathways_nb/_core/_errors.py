"""The error family every role raises and every other role understands.

Plain meanings for failure, after trio: closed (you closed it), broken (the other side
died), busy, data lost. A remote failure reaches the notebook as one ``RemoteError``
that carries the remote traceback and renders it as IPython would.
"""

from __future__ import annotations

from typing import Any


class PathwaysError(Exception):
    """Base class of every error pathways_nb raises on purpose."""


class ClosedError(PathwaysError):
    """The object was closed or released by this side and can no longer be used."""


class BrokenError(PathwaysError):
    """The other side of a connection died or stopped answering."""


class BusyError(PathwaysError):
    """The request was refused because a bounded resource is full; retry later."""


class ProtocolError(PathwaysError):
    """A message did not follow the wire protocol."""


class VersionMismatchError(PathwaysError):
    """Two sides run versions that cannot talk to each other."""


class CancelledError(PathwaysError):
    """The work was cancelled before it ran (for example by interrupting the kernel)."""


class RemoteError(PathwaysError):
    """A program or request failed on a host or on the controller.

    ``kind`` names the cause (``"compile"``, ``"runtime"``, ``"resource_exhausted"``,
    ``"data_loss"``, ``"cancelled"``, ``"fault_injected"``, ...); ``program``, ``slice`` and
    ``host`` say where; ``remote_traceback`` is the text of the traceback over there.
    """

    kind = "remote"

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        program: str | None = None,
        slice: str | None = None,
        host: str | None = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind
        self.program = program
        self.slice = slice
        self.host = host
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        where = ", ".join(
            f"{k} {v}"
            for k, v in (("program", self.program), ("slice", self.slice), ("host", self.host))
            if v
        )
        return f"[{self.kind}] {self.message}" + (f" ({where})" if where else "")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.to_dict()))

    def to_dict(self) -> dict[str, Any]:
        """A msgpack-able form, the inverse of :meth:`from_dict`."""
        return {
            "message": self.message,
            "kind": self.kind,
            "program": self.program,
            "slice": self.slice,
            "host": self.host,
            "traceback": self.remote_traceback,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RemoteError:
        """Rebuild the right subclass from :meth:`to_dict` output."""
        cls = _KINDS.get(str(d.get("kind")), RemoteError)
        return cls(
            str(d.get("message", "")),
            kind=d.get("kind"),
            program=d.get("program"),
            slice=d.get("slice"),
            host=d.get("host"),
            remote_traceback=str(d.get("traceback") or ""),
        )

    def _render_traceback_(self) -> list[str]:
        lines = []
        if self.remote_traceback:
            lines.append(f"---- remote traceback (host {self.host}) ----")
            lines.extend(self.remote_traceback.rstrip().splitlines())
            lines.append("----")
        lines.append(f"{type(self).__name__}: {self}")
        return lines


class DataLossError(RemoteError):
    """The array's buffers were lost with the host that held them."""

    kind = "data_loss"


class ResourceExhaustedError(RemoteError):
    """A host's object store or device memory limit was exceeded."""

    kind = "resource_exhausted"


# What a launch's ``check`` field asks its host to look for in its outputs (bits).
CHECK_NANS = 1
CHECK_INFS = 2


class NonFiniteError(RemoteError, FloatingPointError):
    """A program's output held NaN (or infinity) while the client had ``jax_debug_nans``
    (or ``jax_debug_infs``) set: what ``jax.jit`` raises as ``FloatingPointError`` there,
    raised where the output is fetched or used."""

    kind = "non_finite"


def _rebuild(cls: type[RemoteError], d: dict[str, Any]) -> RemoteError:
    err = RemoteError.from_dict(d)
    err.__class__ = cls
    return err


_KINDS: dict[str, type[RemoteError]] = {
    "data_loss": DataLossError,
    "resource_exhausted": ResourceExhaustedError,
    "non_finite": NonFiniteError,
}
