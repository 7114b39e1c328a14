"""The error family: plain meanings, and RemoteError across the wire and through pickle."""

from __future__ import annotations

import pickle

import pytest

from pathways_nb._core import (
    BrokenError,
    BusyError,
    CancelledError,
    ClosedError,
    DataLossError,
    PathwaysError,
    ProtocolError,
    RemoteError,
    ResourceExhaustedError,
    VersionMismatchError,
)

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "step.py", line 3, in step\n'
    "XlaRuntimeError: INTERNAL: boom\n"
)


def full(cls: type[RemoteError] = RemoteError, kind: str | None = "runtime") -> RemoteError:
    return cls(
        "XlaRuntimeError: INTERNAL: boom",
        kind=kind,
        program="train_step",
        slice="s1",
        host="h0",
        remote_traceback=TRACEBACK,
    )


@pytest.mark.parametrize(
    "cls",
    [
        ClosedError,
        BrokenError,
        BusyError,
        ProtocolError,
        VersionMismatchError,
        CancelledError,
        RemoteError,
        DataLossError,
        ResourceExhaustedError,
    ],
)
def test_every_error_is_a_pathways_error(cls: type[Exception]) -> None:
    assert issubclass(cls, PathwaysError)


def test_str_says_kind_message_and_where() -> None:
    assert str(full()) == (
        "[runtime] XlaRuntimeError: INTERNAL: boom (program train_step, slice s1, host h0)"
    )
    assert str(RemoteError("lost")) == "[remote] lost"
    assert str(DataLossError("lost", host="h1")) == "[data_loss] lost (host h1)"
    assert str(ResourceExhaustedError("full", slice="s2")) == "[resource_exhausted] full (slice s2)"


def test_to_dict_is_plain_data() -> None:
    assert full().to_dict() == {
        "message": "XlaRuntimeError: INTERNAL: boom",
        "kind": "runtime",
        "program": "train_step",
        "slice": "s1",
        "host": "h0",
        "traceback": TRACEBACK,
    }
    assert DataLossError("x").to_dict()["kind"] == "data_loss"


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (RemoteError, "runtime"),
        (RemoteError, "compile"),
        (DataLossError, None),
        (ResourceExhaustedError, None),
    ],
)
def test_from_dict_rebuilds_the_right_subclass(cls: type[RemoteError], kind: str | None) -> None:
    err = full(cls, kind)
    back = RemoteError.from_dict(err.to_dict())
    assert type(back) is cls
    assert back.to_dict() == err.to_dict()
    assert str(back) == str(err)


def test_from_dict_chooses_the_subclass_by_kind() -> None:
    assert type(RemoteError.from_dict({"message": "m", "kind": "data_loss"})) is DataLossError
    assert type(RemoteError.from_dict({"kind": "resource_exhausted"})) is ResourceExhaustedError
    other = RemoteError.from_dict({"message": "m", "kind": "fault_injected"})
    assert type(other) is RemoteError and other.kind == "fault_injected"


def test_from_dict_fills_what_is_missing() -> None:
    err = RemoteError.from_dict({})
    assert type(err) is RemoteError
    assert (err.message, err.kind, err.program, err.slice, err.host) == ("", "remote", *[None] * 3)
    assert err.remote_traceback == ""
    assert RemoteError.from_dict({"traceback": None}).remote_traceback == ""


@pytest.mark.parametrize(
    "err",
    [
        full(),
        full(DataLossError, None),
        full(ResourceExhaustedError, None),
        RemoteError("plain"),
        # An explicit kind that names a subclass must not change the class on unpickling.
        RemoteError("m", kind="data_loss"),
        DataLossError("m", kind="runtime"),
    ],
    ids=["runtime", "data_loss", "resource_exhausted", "plain", "kind-only", "subclass-kind"],
)
def test_pickle_keeps_class_and_fields(err: RemoteError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.to_dict() == err.to_dict()
    assert str(back) == str(err)
    assert back.args == err.args


def test_render_traceback_shows_the_remote_traceback_then_the_error() -> None:
    assert full(DataLossError, None)._render_traceback_() == [
        "---- remote traceback (host h0) ----",
        "Traceback (most recent call last):",
        '  File "step.py", line 3, in step',
        "XlaRuntimeError: INTERNAL: boom",
        "----",
        "DataLossError: [data_loss] XlaRuntimeError: INTERNAL: boom "
        "(program train_step, slice s1, host h0)",
    ]


def test_render_traceback_without_a_remote_traceback_is_one_line() -> None:
    err = RemoteError("cancelled by the client", kind="cancelled", program="f")
    assert err._render_traceback_() == [
        "RemoteError: [cancelled] cancelled by the client (program f)"
    ]
