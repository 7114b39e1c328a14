"""Turning host-side exceptions into the RemoteError a notebook user reads."""

from __future__ import annotations

import traceback

from pathways_nb._core import RemoteError


def to_remote(exc: BaseException, kind: str, *, program: str, slice: str, host: str) -> RemoteError:
    """Wrap ``exc``; a RemoteError passes through with its origin filled in where missing."""
    if isinstance(exc, RemoteError):
        exc.program = exc.program or program
        exc.slice = exc.slice or slice
        exc.host = exc.host or host
        return exc
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    # XLA's messages run to pages; the first line says what happened, the rest goes to
    # the remote traceback that _render_traceback_ shows.
    message = f"{type(exc).__name__}: {first[:500]}" if first else type(exc).__name__
    return RemoteError(
        message,
        kind=kind,
        program=program,
        slice=slice,
        host=host,
        remote_traceback="".join(traceback.format_exception(exc)),
    )
