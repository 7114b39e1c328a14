"""How the proxy's failures reach the JAX client: absl status codes and messages."""

from __future__ import annotations

from typing import Any

from pathways_nb._core import (
    BrokenError,
    BusyError,
    ClosedError,
    DataLossError,
    RemoteError,
    ResourceExhaustedError,
)

OK = 0
CANCELLED = 1
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15


class ProxyError(Exception):
    """A request the proxy refuses or could not carry out, with its status code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def unimplemented(what: str) -> ProxyError:
    return ProxyError(
        UNIMPLEMENTED,
        f"{what} is not implemented by the pathways_nb IFRT proxy; the JAX operations it "
        "serves are listed in the README, under 'Plain JAX, unchanged'",
    )


def code_of(exc: BaseException) -> int:
    """The status code of a failure: a lost host is DATA_LOSS, as Pathways on Cloud
    answers it (``pathwaysutils.elastic`` reads it as a slice gone down)."""
    if isinstance(exc, ProxyError):
        return exc.code
    if isinstance(exc, DataLossError):
        return DATA_LOSS
    if isinstance(exc, ResourceExhaustedError):
        return RESOURCE_EXHAUSTED
    if isinstance(exc, BusyError):
        return RESOURCE_EXHAUSTED
    if isinstance(exc, ClosedError | BrokenError):
        return UNAVAILABLE
    if isinstance(exc, TimeoutError):
        return DEADLINE_EXCEEDED
    if isinstance(exc, RemoteError):
        kind = getattr(exc, "kind", "")
        if kind == "invalid":
            return INVALID_ARGUMENT
        if kind == "resource_exhausted":
            return RESOURCE_EXHAUSTED
        if kind == "data_loss":
            return DATA_LOSS
        return INTERNAL
    if isinstance(exc, ValueError | TypeError | KeyError):
        return INVALID_ARGUMENT
    return INTERNAL


def message_of(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ProxyError):
        return text
    return f"{type(exc).__name__}: {text}"


def grpc_code(exc: BaseException) -> Any:
    """The gRPC status code of a failure, for the RPCs beside the session's stream."""
    import grpc

    code = code_of(exc)
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.INTERNAL)


def fill(status: Any, exc: BaseException) -> None:
    """Write ``exc`` into a ``tensorflow.StatusProto``."""
    status.code = code_of(exc)
    status.message = message_of(exc)
