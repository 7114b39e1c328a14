"""Message types and the fields each must carry.

Every endpoint checks a message against its schema before acting on it; a message that
fails gets an ``error`` reply and is dropped, so no peer can take a process down.
"""

from __future__ import annotations

from typing import Any

from pathways_nb._core import ProtocolError

_INT = (int,)
_STR = (str,)
_LIST = (list,)
_DICT = (dict,)
_NUM = (int, float)
_OPT_STR = (str, type(None))

# type -> {field: allowed python types}; fields beyond these are ignored.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    # handshake, both planes
    "hello": {"role": _STR, "versions": _DICT},
    "welcome": {},
    "refuse": {"reason": _STR},
    "error": {"message": _STR},
    "heartbeat": {},
    # client -> controller
    "allocate": {"rid": _INT, "mesh": _LIST, "name": _OPT_STR},
    "release": {"rid": _INT, "slice": _STR},
    "program": {"pid": _STR, "name": _STR, "nin": _INT, "nout": _INT},
    "launch": {
        "lid": _INT,
        "slice": _STR,
        "pid": _STR,
        "ins": _LIST,
        "outs": _LIST,
        "donate": _LIST,
    },
    "put_note": {"handle": _INT, "slice": _STR, "nbytes": _INT},
    "transfer": {
        "lid": _INT,
        "src": _INT,
        "dst": _INT,
        "slice": _STR,
        "shape": _LIST,
        "dtype": _STR,
        "spec": _LIST,
    },
    "delete": {"handles": _LIST},
    "batch": {"msgs": _LIST},
    "status": {"rid": _INT},
    "events": {"rid": _INT, "since": _NUM},
    "cancel": {"rid": _INT},
    "probe": {"rid": _INT, "slice": _STR, "pid": _STR},
    "inject_fault": {"rid": _INT, "host": _STR, "match": _STR, "kind": _STR},
    "bye": {},
    # controller -> client
    "reply": {"rid": _INT},
    "done": {"items": _LIST},
    "host_lost": {"host": _STR, "slices": _LIST},
    "remapped": {"slice": _DICT, "data_address": _STR, "platform": _STR},
    # host -> controller
    "register": {
        "host": _STR,
        "island": _STR,
        "devices": _LIST,
        "data_address": _STR,
        "versions": _DICT,
        "process": _STR,
        "platform": _STR,
    },
    "acks": {"items": _LIST},
    "parked": {"lids": _LIST},
    "host_reply": {"rid": _INT},
    # controller -> host
    "run": {
        "lid": _INT,
        "slice": _STR,
        "pid": _STR,
        "ins": _LIST,
        "outs": _LIST,
        "donate": _LIST,
        "devices": _LIST,
        "mesh": _LIST,
    },
    "drop": {"handles": _LIST},
    "send": {
        "lid": _INT,
        "src": _INT,
        "dst": _INT,
        "address": _STR,
        "shape": _LIST,
        "spec": _LIST,
        "devices": _LIST,
        "mesh": _LIST,
    },
    "recv": {"dst": _INT, "source": _STR},
    # ... in the island's order, after the deletions the client sent before the put
    "noted": {"handle": _INT},
    "host_probe": {"rid": _INT, "pid": _STR, "devices": _LIST, "mesh": _LIST},
    "fault": {"match": _STR, "kind": _STR, "tenant": _INT},
    "fail_outputs": {"handles": _LIST, "error": _DICT},
    "cancel_runs": {"tenant": _INT, "message": _STR},
    "forget_programs": {"pids": _LIST},
    # client -> host (data plane)
    "put": {
        "rid": _INT,
        "handle": _INT,
        "shape": _LIST,
        "dtype": _STR,
        "spec": _LIST,
        "devices": _LIST,
        "mesh": _LIST,
    },
    # ... of an array a Dask task on the host's own worker is computing (a Dask put)
    "expect": {"rid": _INT, "handle": _INT},
    "put_failed": {"rid": _INT, "handle": _INT, "error": _DICT},
    "fetch": {"rid": _INT, "handle": _INT},
    "wait": {"rid": _INT, "handle": _INT},
    # ... of a checkpoint: an array written to, or read from, a file on the host
    "save": {"rid": _INT, "handle": _INT, "path": _STR, "stage": _STR},
    # ... of how a background save's write ended
    "saved": {"rid": _INT, "handle": _INT, "path": _STR},
    # ... to rename a save's staged files into place (keep) or remove them
    "commit_save": {"rid": _INT, "stage": _STR, "keep": (bool,), "count": _INT},
    "load": {
        "rid": _INT,
        "handle": _INT,
        "path": _STR,
        "shape": _LIST,
        "dtype": _STR,
        "spec": _LIST,
        "devices": _LIST,
        "mesh": _LIST,
    },
    # ... to start or stop XLA's profiler in the host's process (see worker/_profiles)
    "profile": {"rid": _INT, "op": _STR},
    # ... of several arrays on one host, answered at once (at most 512 handles)
    "fetch_many": {"rid": _INT, "handles": _LIST},
    "wait_many": {"rid": _INT, "handles": _LIST},
    # host -> host (data plane): one piece of a transfer, or its error
    "xfer": {
        "handle": _INT,
        "lid": _INT,
        "shape": _LIST,
        "spec": _LIST,
        "devices": _LIST,
        "mesh": _LIST,
        "pieces": _INT,
        "source": _STR,
        "t0": _NUM,
    },
    # host -> client (data plane)
    "array": {"rid": _INT, "shape": _LIST, "dtype": _STR},
    "arrays": {"rid": _INT, "shapes": _LIST, "dtypes": _LIST, "key_impls": _LIST},
    "failed": {"rid": _INT, "error": _DICT},
}


def check(header: dict[str, Any], allowed: frozenset[str] | None = None) -> str:
    """Return the message type after checking its fields; raise ProtocolError otherwise."""
    kind = header.get("t")
    fields = _FIELDS.get(kind) if type(kind) is str else None
    if fields is None or (allowed is not None and kind not in allowed):
        expected = sorted(allowed) if allowed is not None else sorted(SCHEMAS)
        raise ProtocolError(f"unexpected message type {kind!r} here; expected one of {expected}")
    get = header.get
    # msgpack decodes to exact builtin types, so an exact type test suffices; it also
    # keeps booleans out of integer fields.
    for field, types in fields:
        if type(get(field, _MISSING)) not in types:
            _explain(str(kind), header, field, types)
    return str(kind)


_MISSING = object()
_FIELDS: dict[str, tuple[tuple[str, tuple[type, ...]], ...]] = {
    kind: tuple(schema.items()) for kind, schema in SCHEMAS.items()
}


def _explain(kind: str, header: dict[str, Any], field: str, types: tuple[type, ...]) -> None:
    if field not in header:
        raise ProtocolError(f"{kind!r} message lacks field {field!r}")
    names = "/".join(t.__name__ for t in types)
    raise ProtocolError(
        f"{kind!r} message field {field!r} must be {names}; got {type(header[field]).__name__}"
    )


def error_header(message: str, rid: Any = None) -> dict[str, Any]:
    """An ``error`` reply, echoing the request id when the request had a valid one."""
    header: dict[str, Any] = {"t": "error", "message": message}
    if isinstance(rid, int) and not isinstance(rid, bool):
        header["rid"] = rid
    return header


__all__ = ["SCHEMAS", "check", "error_header"]
