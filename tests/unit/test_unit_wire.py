"""Frames ↔ messages, and the schema every endpoint checks before acting."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from pathways_nb._core import ProtocolError
from pathways_nb.wire import SCHEMAS, Message, check, decode, encode
from pathways_nb.wire._messages import error_header

_GOOD: dict[type, Any] = {int: 3, str: "x", list: [1], dict: {"a": 1}, float: 0.5, bool: True}


def valid(kind: str) -> dict[str, Any]:
    """The smallest header of type ``kind`` that passes its schema."""
    return {"t": kind} | {f: _GOOD[types[0]] for f, types in SCHEMAS[kind].items()}


def test_encode_decode_roundtrip_with_buffers() -> None:
    header = {
        "t": "put",
        "rid": 7,
        "shape": [2, 3],
        "dtype": "float32",
        "spec": ["data", None, ["a", "b"]],
        "nested": {"x": 1.5, 2: b"\x00\xff"},
    }
    payload = np.arange(6, dtype=np.float32)
    frames = encode(header, [payload.tobytes(), memoryview(b"tail")])
    assert len(frames) == 3 and isinstance(frames[0], bytes)
    msg = decode(frames)
    assert msg == Message(header, [payload.tobytes(), memoryview(b"tail")])
    assert msg.type == "put"
    np.testing.assert_array_equal(np.frombuffer(msg.buffers[0], np.float32), payload)


def test_encode_without_buffers_is_one_frame() -> None:
    frames = encode({"t": "heartbeat"})
    assert frames == [msgpack.packb({"t": "heartbeat"})]
    assert decode(frames) == Message({"t": "heartbeat"}, [])


def test_decode_reads_zmq_frames_without_copying_into_the_header() -> None:
    header, body = encode({"t": "array", "rid": 1, "shape": [2], "dtype": "uint8"}, [b"\x01\x02"])
    msg = decode([zmq.Frame(header), zmq.Frame(body)])
    assert msg.header == {"t": "array", "rid": 1, "shape": [2], "dtype": "uint8"}
    assert isinstance(msg.buffers[0], memoryview)
    assert bytes(msg.buffers[0]) == b"\x01\x02"


def test_decode_rejects_an_empty_message() -> None:
    with pytest.raises(ProtocolError, match="empty message: expected a msgpack header frame"):
        decode([])


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"\x81", b"\x82\xa1t", msgpack.packb({"t": "x"}) + b"\x00"],
    ids=["empty", "never-used-byte", "truncated-map", "truncated-key", "trailing-bytes"],
)
def test_decode_rejects_a_header_that_is_not_msgpack(raw: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"header frame is not valid msgpack \(\w+\)"):
        decode([raw])


@pytest.mark.parametrize(
    ("header", "got"),
    [
        ([1, 2], "list"),
        ("hello", "str"),
        (3, "int"),
        ({"type": "hello"}, "dict"),
        ({"t": 1}, "dict"),
        ({"t": None}, "dict"),
    ],
)
def test_decode_rejects_a_header_that_is_not_a_typed_map(header: Any, got: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode([msgpack.packb(header)])
    assert str(info.value) == (
        f"header must be a msgpack map with a string type under 't'; got {got}"
    )


def test_decode_rejects_messages_over_the_limit_counting_every_frame() -> None:
    frames = encode({"t": "put"}, [b"x" * 90])
    total = len(frames[0]) + 90
    assert decode(frames, max_bytes=total).buffers == [b"x" * 90]
    with pytest.raises(ProtocolError) as info:
        decode(frames, max_bytes=total - 1)
    assert str(info.value) == (
        f"message of {total} bytes is larger than this endpoint accepts ({total - 1}); "
        "send arrays in smaller pieces or raise the limit in pathways_nb.Config"
    )


def test_garbage_gives_a_checked_message_or_a_protocol_error_only() -> None:
    rng = np.random.default_rng(1234)
    valid_header = encode(valid("launch"))[0]
    outcomes = {"message": 0, "protocol": 0}
    for i in range(600):
        if i % 2:
            raw = rng.integers(0, 256, int(rng.integers(0, 48)), dtype=np.uint8).tobytes()
        else:
            # A real header with a few bytes changed gets further into the parser.
            buf = bytearray(valid_header)
            for pos in rng.integers(0, len(buf), int(rng.integers(1, 3))):
                buf[pos] = int(rng.integers(0, 256))
            raw = bytes(buf)
        try:
            msg = decode([raw, raw])
            check(msg.header)
        except ProtocolError:
            outcomes["protocol"] += 1
        else:
            outcomes["message"] += 1
    assert outcomes["protocol"] > 100 and outcomes["message"] > 10


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_schema_accepts_its_minimal_message_and_ignores_extras(kind: str) -> None:
    assert check(valid(kind)) == kind
    assert check(valid(kind) | {"extra": object()}) == kind


def test_check_rejects_unknown_types_naming_the_expected_ones() -> None:
    with pytest.raises(ProtocolError) as info:
        check({"t": "launch_everything"})
    assert str(info.value) == (
        f"unexpected message type 'launch_everything' here; expected one of {sorted(SCHEMAS)}"
    )
    with pytest.raises(ProtocolError, match="unexpected message type None here"):
        check({})
    with pytest.raises(ProtocolError, match="unexpected message type 5 here"):
        check({"t": 5})


def test_check_rejects_types_not_allowed_at_this_endpoint() -> None:
    allowed = frozenset({"heartbeat", "acks"})
    assert check({"t": "heartbeat"}, allowed) == "heartbeat"
    with pytest.raises(ProtocolError) as info:
        check(valid("launch"), allowed)
    assert str(info.value) == (
        "unexpected message type 'launch' here; expected one of ['acks', 'heartbeat']"
    )


def test_check_rejects_a_missing_field() -> None:
    header = valid("release")
    del header["slice"]
    with pytest.raises(ProtocolError) as info:
        check(header)
    assert str(info.value) == "'release' message lacks field 'slice'"


@pytest.mark.parametrize(
    ("kind", "field", "value", "message"),
    [
        ("release", "rid", True, "field 'rid' must be int; got bool"),
        ("release", "rid", 1.0, "field 'rid' must be int; got float"),
        ("release", "slice", b"s1", "field 'slice' must be str; got bytes"),
        ("events", "since", False, "field 'since' must be int/float; got bool"),
        ("events", "since", "0", "field 'since' must be int/float; got str"),
        ("allocate", "name", 3, "field 'name' must be str/NoneType; got int"),
        ("allocate", "mesh", {"data": 4}, "field 'mesh' must be list; got dict"),
        ("hello", "versions", None, "field 'versions' must be dict; got NoneType"),
    ],
)
def test_check_rejects_wrong_field_types(kind: str, field: str, value: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check(valid(kind) | {field: value})
    assert str(info.value) == f"{kind!r} message {message}"


def test_check_accepts_optional_and_numeric_alternatives() -> None:
    assert check(valid("allocate") | {"name": None}) == "allocate"
    assert check(valid("events") | {"since": 0}) == "events"
    assert check(valid("events") | {"since": 1.5}) == "events"


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_field_accepts_exactly_its_types(kind: str) -> None:
    candidates: list[Any] = [None, True, 0, 1.5, "s", b"b", [], {}]
    for field, types in SCHEMAS[kind].items():
        for value in candidates:
            ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
            header = valid(kind) | {field: value}
            if ok:
                assert check(header) == kind
            else:
                with pytest.raises(ProtocolError, match=f"field {field!r} must be"):
                    check(header)


def test_error_header_echoes_only_a_valid_request_id() -> None:
    assert error_header("bad", 4) == {"t": "error", "message": "bad", "rid": 4}
    assert error_header("bad", True) == {"t": "error", "message": "bad"}
    assert error_header("bad", "4") == {"t": "error", "message": "bad"}
    assert error_header("bad") == {"t": "error", "message": "bad"}
    assert check(error_header("bad", 4)) == "error"


def test_dtypes_cross_the_wire_by_code_or_by_ml_dtypes_name() -> None:
    import jax.numpy as jnp

    from pathways_nb._core import as_bytes, decode_dtype, encode_dtype

    for dtype in (np.float32, np.int64, np.bool_, np.complex64, jnp.bfloat16, jnp.float8_e4m3fn):
        assert decode_dtype(encode_dtype(dtype)) == np.dtype(dtype)
    assert encode_dtype(jnp.bfloat16) == "bfloat16"  # not NumPy's "<V2"
    for bad in ("<V2", "object", "U3", "datetime64[s]", "nonsense", 7):
        with pytest.raises(ProtocolError, match="not a numeric array type"):
            decode_dtype(bad)
    x = np.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    frame = as_bytes(x)
    assert frame.nbytes == x.nbytes and frame.obj.base is not None  # a view, not a copy
    back = np.frombuffer(frame, dtype=decode_dtype(encode_dtype(x.dtype))).reshape(x.shape)
    np.testing.assert_array_equal(back, x)
    assert as_bytes(np.array(1.5, np.float32)).nbytes == 4
