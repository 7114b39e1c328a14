"""A host's data-plane peers as a state machine: hellos, tokens, what each may ask."""

from __future__ import annotations

from typing import Any

import pytest

from pathways_nb._core import host_token, local_versions, new_secret, tenant_token
from pathways_nb.worker._peers import Peers

SECRET = new_secret()


def _hello(**fields: Any) -> dict[str, Any]:
    return {"t": "hello", "rid": 3, "versions": local_versions().to_dict(), **fields}


def _client(tenant: int) -> dict[str, Any]:
    return _hello(role="client", tenant=tenant, token=tenant_token(SECRET, tenant))


def test_hellos_before_the_controllers_key_are_answered_when_it_comes() -> None:
    peers = Peers("h0", local_versions())
    assert peers.host_token() == b""  # no key yet
    assert peers.hello(b"a", _client(1)) is None
    assert peers.hello(b"b", _hello(role="client", tenant=2, token=b"forged")) is None
    assert peers.refusal(b"a", "fetch", {"handle": 1 << 40}) == "say hello before anything else"
    answers = dict(peers.key(SECRET))
    assert answers[b"a"] == {"t": "welcome", "rid": 3}
    assert answers[b"b"]["t"] == "refuse" and "does not prove tenant 2" in answers[b"b"]["reason"]
    assert peers.host_token() == host_token(SECRET)
    assert peers.key(SECRET) == []  # nothing owed twice


@pytest.mark.parametrize("secret", [None, "text", b"short"])
def test_a_welcome_without_a_key_is_refused(secret: object) -> None:
    with pytest.raises(ValueError, match="no key of 32 bytes"):
        Peers("h0", local_versions()).key(secret)


def test_a_client_is_served_its_own_arrays_and_a_host_only_transfers() -> None:
    peers = Peers("h0", local_versions())
    peers.key(SECRET)
    assert peers.hello(b"c", _client(5))["t"] == "welcome"  # type: ignore[index]
    assert peers.hello(b"h", _hello(role="host", token=host_token(SECRET)))["t"] == "welcome"  # type: ignore[index]
    own, other = (5 << 40) | 9, (6 << 40) | 9
    assert peers.refusal(b"c", "fetch", {"handle": own}) is None
    assert peers.refusal(b"c", "wait_many", {"handles": [own, "bad", 1.5]}) is None
    why = peers.refusal(b"c", "fetch_many", {"handles": [own, other]})
    assert why is not None and why.startswith("fetch_many: array 0x60000000009 belongs to tenant 6")
    assert "only hosts send 'xfer'" in str(peers.refusal(b"c", "xfer", {}))
    assert peers.refusal(b"h", "xfer", {}) is None
    assert "a host sends only transfers" in str(peers.refusal(b"h", "put", {"handle": own}))
    peers.forget(b"c")  # its connection closed
    assert peers.refusal(b"c", "fetch", {"handle": own}) == "say hello before anything else"
