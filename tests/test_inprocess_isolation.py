"""Tenants' arrays are their own: a client that does not play by the rules (speaking
the protocol itself, naming ids it did not make) cannot read, overwrite, fail or delete
another tenant's arrays, through the controller or through a host, and hears why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb._core import local_versions


class RawTenant:
    """A tenant that speaks the protocol itself over its own sockets."""

    def __init__(self, cluster: pw.InProcessCluster) -> None:
        self._ctx = cluster.context
        # Every socket it opens, closed with it: one left open (held by a failed test's
        # traceback) would keep the cluster's context from terminating.
        self._sockets: list[zmq.Socket[Any]] = []
        self.ctl = self.dealer(cluster.controller.client_address)
        hello = {"t": "hello", "role": "client", "rid": 1, "versions": _versions()}
        welcome = self.ask(self.ctl, hello)
        assert welcome["t"] == "welcome", welcome
        self.tenant: int = welcome["tenant"]
        self.token: bytes = welcome["token"]
        reply = self.ask(self.ctl, {"t": "allocate", "rid": 2, "mesh": [["x", 2]], "name": None})
        self.slice: str = reply["slice"]["slice"]
        self.data_address: str = reply["data_address"]
        self._next = 0

    def dealer(self, address: str) -> zmq.Socket[Any]:
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10_000)
        s.connect(address)
        self._sockets.append(s)
        return s

    def id(self) -> int:
        """An id of its own, made as a client makes them."""
        self._next += 1
        return (self.tenant << 40) | self._next

    def ask(self, sock: zmq.Socket[Any], header: dict[str, Any]) -> dict[str, Any]:
        sock.send_multipart([msgpack.packb(header)])
        return dict(msgpack.unpackb(sock.recv_multipart()[0]))

    def close(self) -> None:
        self.ctl.send_multipart([msgpack.packb({"t": "bye"})])  # its slice is freed
        for s in self._sockets:
            s.close(0)


def _versions() -> dict[str, Any]:
    return local_versions().to_dict()


@pytest.fixture
def raw(cluster: pw.InProcessCluster) -> Iterator[RawTenant]:
    r = RawTenant(cluster)
    yield r
    r.close()


def test_the_controller_takes_no_request_naming_another_tenants_ids(
    client: pw.Client, raw: RawTenant
) -> None:
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("x"))
    y = pw.jit(lambda v: v * 2, name="double")(x)
    pid = next(iter(client._programs_sent))
    mine = raw.id()
    attempts: list[tuple[dict[str, Any], str]] = [
        ({"t": "delete", "handles": [x.handle, y.handle]}, "delete: 2 handle(s) not deleted"),
        ({"t": "put_note", "handle": x.handle, "slice": raw.slice, "nbytes": 16}, "put_note: "),
        (
            {
                "t": "launch",
                "lid": raw.id(),
                "slice": raw.slice,
                "pid": pid,
                "ins": [mine],
                "outs": [x.handle],  # written over by this launch's output
                "donate": [],
            },
            "'program': 'double'",  # its launch fails, named by its program
        ),
        (
            {
                "t": "launch",
                "lid": y._lid,  # the controller would account the other's launch to it
                "slice": raw.slice,
                "pid": pid,
                "ins": [mine],
                "outs": [raw.id()],
                "donate": [],
            },
            "'program': 'double'",  # its launch fails, named by its program
        ),
        (
            {
                "t": "transfer",
                "lid": raw.id(),
                "src": x.handle,
                "dst": raw.id(),
                "slice": raw.slice,
                "shape": [4],
                "dtype": "<f4",
                "spec": [],
            },
            "'program': 'transfer'",
        ),
    ]
    for header, what in attempts:
        reply = raw.ask(raw.ctl, header)
        text = str(reply.get("message") or reply.get("items"))
        assert reply["t"] in ("error", "done"), reply
        assert what in text and f"belongs to tenant {client.tenant}" in text, reply
    # The other tenant never noticed: its arrays and programs are as they were.
    np.testing.assert_array_equal(x.fetch(), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(y.fetch(), np.arange(4, dtype=np.float32) * 2)
    np.testing.assert_array_equal((x + y).fetch(), np.arange(4, dtype=np.float32) * 3)
    client.wait_all(timeout=10)  # and its launches are accounted for


def test_a_host_serves_a_connection_only_its_tenants_arrays(
    client: pw.Client, raw: RawTenant
) -> None:
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("x"))
    x.block_until_ready()
    sock = raw.dealer(vs.data_address)
    hello = {"t": "hello", "role": "client", "rid": 1, "versions": _versions()}
    assert raw.ask(sock, {**hello, "tenant": raw.tenant, "token": raw.token})["t"] == "welcome"
    put = {"shape": [4], "dtype": "<f4", "spec": [], "devices": vs.devices, "mesh": [["x", 2]]}
    for header in (
        {"t": "fetch", "rid": 2, "handle": x.handle},
        {"t": "wait", "rid": 3, "handle": x.handle},
        {"t": "fetch_many", "rid": 4, "handles": [raw.id(), x.handle]},
        {"t": "wait_many", "rid": 5, "handles": [x.handle]},
        {"t": "put_failed", "rid": 6, "handle": x.handle, "error": {"message": "gone"}},
        {"t": "expect", "rid": 7, "handle": x.handle},
        # Nor may it write another's array to a file, or read a file into its handle.
        {
            "t": "save",
            "rid": 9,
            "handle": x.handle,
            "path": "/tmp/pathways-stolen.npy",
            "stage": "0123456789abcdef",
        },
        {"t": "load", "rid": 10, "handle": x.handle, "path": "/tmp/x.npy", **put},
        {"t": "saved", "rid": 11, "handle": x.handle, "path": "/tmp/x.npy"},
    ):
        reply = raw.ask(sock, header)
        assert reply["t"] == "error" and reply["rid"] == header["rid"], reply
        assert f"belongs to tenant {client.tenant}, not to this client" in reply["message"]
    sock.send_multipart(
        [msgpack.packb({"t": "put", "rid": 8, "handle": x.handle, **put}), b"\0" * 16]
    )
    reply = dict(msgpack.unpackb(sock.recv_multipart()[0]))
    assert reply["t"] == "error" and "belongs to tenant" in reply["message"], reply
    xfer = {"t": "xfer", "handle": raw.id(), "lid": raw.id(), "pieces": 1, "source": "me"}
    reply = raw.ask(sock, {**xfer, **put, "t0": 0.0})
    assert reply["t"] == "error" and "only hosts send 'xfer'" in reply["message"], reply
    # A save's commit names no array: the host commits only what this tenant staged.
    commit = {"t": "commit_save", "rid": 12, "stage": "0" * 16, "keep": True, "count": 1}
    reply = raw.ask(sock, commit)
    assert reply["t"] == "failed" and "no save" in reply["error"]["message"], reply
    sock.close(0)
    np.testing.assert_array_equal(x.fetch(), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal((x + 1).fetch(), np.arange(1, 5, dtype=np.float32))


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        ({"role": "client"}, "names its tenant id"),
        ({"role": "client", "tenant": "1"}, "names its tenant id"),
        ({"role": "client", "tenant": 0, "token": b""}, "names its tenant id"),
        ({"role": "client", "tenant": "other"}, "does not prove tenant"),
        ({"role": "client", "tenant": "mine", "token": b"forged"}, "does not prove tenant"),
        ({"role": "client", "tenant": "mine", "token": "as text"}, "does not prove tenant"),
        ({"role": "host", "token": "raw"}, "not a host's"),
        ({"role": "host"}, "not a host's"),
        ({"role": "spy", "token": "raw"}, "role is 'client' or 'host'"),
    ],
)
def test_a_hello_must_prove_its_tenant_or_that_it_is_a_host(
    client: pw.Client, raw: RawTenant, claim: dict[str, Any], reason: str
) -> None:
    """A token proves one tenant id: another tenant's id with it, no token, or a forged
    one is refused, and the connection is served nothing."""
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("x"))
    named = {"other": client.tenant, "mine": raw.tenant}
    hello: dict[str, Any] = {"t": "hello", "rid": 1, "versions": _versions()}
    for k, v in claim.items():
        hello[k] = named.get(v, v) if k == "tenant" else (raw.token if v == "raw" else v)
    if claim.get("tenant") == "other":
        hello["token"] = raw.token  # its own token, another tenant's id
    sock = raw.dealer(vs.data_address)
    reply = raw.ask(sock, hello)
    assert reply["t"] == "refuse" and reason in reply["reason"], reply
    reply = raw.ask(sock, {"t": "fetch", "rid": 2, "handle": x.handle})
    assert reply["t"] == "error" and "say hello" in reply["message"], reply
    sock.close(0)
    np.testing.assert_array_equal(x.fetch(), np.arange(4, dtype=np.float32))


def test_a_fault_one_tenant_injects_is_taken_by_its_own_programs_only() -> None:
    with pw.InProcessCluster(1, 4) as c, c.client() as a, c.client() as b:
        va, vb = a.allocate({"x": 2}), b.allocate({"x": 2})
        assert va.host == vb.host  # one island: both tenants' programs run on one host
        b.inject_fault(va.host, match="shared_step")
        xa = va.put(np.ones(4, np.float32), P("x"))
        np.testing.assert_array_equal(
            pw.jit(lambda v: v + 1, name="shared_step")(xa).fetch(), np.full(4, 2.0)
        )
        xb = vb.put(np.ones(4, np.float32), P("x"))
        with pytest.raises(pw.RemoteError, match="injected fault"):
            pw.jit(lambda v: v + 1, name="shared_step")(xb).fetch()
        # Ending the host would end the other tenant's slice with it.
        with pytest.raises(ValueError, match=r"other tenants' slices \['s\d+'\]"):
            b.inject_fault(vb, match="anything", kind="crash")
        np.testing.assert_array_equal((xa * 3).fetch(), np.full(4, 3.0))


def test_a_program_id_names_its_bytes_alone(client: pw.Client, raw: RawTenant) -> None:
    """A client cannot send other bytes under the id of a program another client runs:
    the controller keeps a program only under the digest of what it carries."""
    vs = client.allocate({"x": 2})
    x = vs.put(np.arange(4, dtype=np.float32), P("x"))
    f = pw.jit(lambda v: v - 1, name="decrement")
    np.testing.assert_array_equal(f(x).fetch(), np.arange(4, dtype=np.float32) - 1)
    (pid,) = {p.pid for p in f._programs.values()}
    header = {"t": "program", "pid": pid, "key": b"mine", "name": "decrement", "nin": 1, "nout": 1}
    raw.ctl.send_multipart([msgpack.packb(header), b"other bytes"])
    reply = dict(msgpack.unpackb(raw.ctl.recv_multipart()[0]))
    assert reply["t"] == "error" and "the id is not the digest" in reply["message"], reply
    np.testing.assert_array_equal(f(x).fetch(), np.arange(4, dtype=np.float32) - 1)


def test_a_client_flooding_the_controller_is_refused_past_its_share() -> None:
    """pw.Client blocks at max_queued_per_client launches not yet done; a client that
    speaks the protocol itself is held to twice that by the controller, whose memory
    would otherwise grow without end, and every other client keeps being served."""
    from pathways_nb._core import Config

    with pw.InProcessCluster(1, 4, config=Config(max_queued_per_client=4)) as cluster:
        client = cluster.client()
        vs = client.allocate({"x": 2})
        x = vs.put(np.arange(4, dtype=np.float32), P("x"))
        double = pw.jit(lambda v: v * 2, name="double")
        double(x).block_until_ready()
        pid = next(iter(client._programs_sent))
        raw = RawTenant(cluster)
        try:
            # An input the raw tenant says it put but never sends: its launches wait on
            # the host and stay pending.
            never = raw.id()
            raw.ctl.send_multipart(
                [
                    msgpack.packb(
                        {"t": "put_note", "handle": never, "slice": raw.slice, "nbytes": 16}
                    )
                ]
            )
            lids = [raw.id() for _ in range(12)]
            for lid in lids:
                launch = {
                    "t": "launch",
                    "lid": lid,
                    "slice": raw.slice,
                    "pid": pid,
                    "ins": [never],
                    "outs": [raw.id()],
                    "donate": [],
                }
                raw.ctl.send_multipart([msgpack.packb(launch)])
            refused: dict[int, Any] = {}
            while len(refused) < 4:
                msg = dict(msgpack.unpackb(raw.ctl.recv_multipart()[0]))
                if msg["t"] == "done":
                    refused |= {lid: err for lid, err in msg["items"] if err}
            assert sorted(refused) == lids[8:]
            err = next(iter(refused.values()))
            assert err["kind"] == "resource_exhausted" and err["program"] == "double"
            assert err["message"].startswith(
                "this client has 8 launches and transfers queued or running, the most the "
                "controller holds for one client (8: twice PATHWAYS_MAX_QUEUED_PER_CLIENT"
            )
            # The other client is served as before.
            np.testing.assert_array_equal(double(x).fetch(), np.arange(4) * 2)
        finally:
            raw.close()
