"""Who is on the other end of each of a host's data-plane connections.

A connection opens with a hello that shows a token from the controller (see
:mod:`pathways_nb._core._keys`): a client's proves its tenant id, a host's that it
registered with the same controller. From then on a client's connection may put,
fetch and wait for that tenant's arrays only, and only hosts may send transfers: no
client can read, overwrite or fail another tenant's arrays through a host.

A plain state machine, used by the host's socket thread alone.
"""

from __future__ import annotations

from typing import Any

from pathways_nb._core import (
    Versions,
    describe_foreign,
    foreign,
    host_token,
    tenant_token,
    token_matches,
)
from pathways_nb._core._keys import SECRET_BYTES

HOST = 0  # the peer is another host (tenant ids start at 1)

# Requests a client sends a host, each with the field naming the arrays it is about
# (None: the request is about no array).
CLIENT_REQUESTS: dict[str, str | None] = {
    "put": "handle",
    "expect": "handle",
    "put_failed": "handle",
    "fetch": "handle",
    "wait": "handle",
    "fetch_many": "handles",
    "wait_many": "handles",
    "save": "handle",
    "saved": "handle",
    "commit_save": None,
    "load": "handle",
    "profile": None,
}


class Peers:
    """The tenant (or :data:`HOST`) each connection proved to be, by identity."""

    def __init__(self, host: str, versions: Versions) -> None:
        self.host = host
        self._versions = versions
        self._secret: bytes | None = None
        self._by_identity: dict[bytes, int] = {}
        # Hellos that came before the controller's welcome gave this host its secret.
        self._early: list[tuple[bytes, dict[str, Any]]] = []

    def key(self, secret: object) -> list[tuple[bytes, dict[str, Any]]]:
        """Take the controller's secret; return the answers owed to hellos that came
        before it, as ``(identity, reply)``. Raises ValueError for a secret that is not
        one (the controller is not one of ours)."""
        if type(secret) is not bytes or len(secret) != SECRET_BYTES:
            raise ValueError(
                f"the controller's welcome carried no key of {SECRET_BYTES} bytes for its "
                f"hosts; got {type(secret).__name__}"
            )
        self._secret = secret
        early, self._early = self._early, []
        return [(identity, reply) for identity, h in early if (reply := self.hello(identity, h))]

    def host_token(self) -> bytes:
        """What this host shows the hosts it sends arrays to."""
        return host_token(self._secret) if self._secret is not None else b""

    def hello(self, identity: bytes, h: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a hello (``welcome`` or ``refuse``), or None until this host has
        its secret; the hello is answered by :meth:`key` then."""
        if self._secret is None:
            self._early.append((identity, h))
            return None
        rid = h.get("rid") if type(h.get("rid")) is int else 0
        try:
            theirs = Versions.from_dict(h["versions"])
            why = theirs.mismatch(self._versions, str(h.get("role")), f"host {self.host}")
        except ValueError as exc:
            why = str(exc)
        if why is None:
            peer, why = self._proven(h, self._secret)
            if why is None:
                self._by_identity[identity] = peer
                return {"t": "welcome", "rid": rid}
        return {"t": "refuse", "rid": rid, "reason": why}

    def _proven(self, h: dict[str, Any], secret: bytes) -> tuple[int, str | None]:
        role, token = h.get("role"), h.get("token")
        if role == "client":
            tenant = h.get("tenant")
            if type(tenant) is not int or tenant < 1:
                return HOST, (
                    "a client's hello names its tenant id (an integer from 1), as the "
                    f"controller's welcome gave it; got {tenant!r}"
                )
            if not token_matches(token, tenant_token(secret, tenant)):
                return HOST, (
                    f"the hello's token does not prove tenant {tenant} to host {self.host}: "
                    "the client connected to another controller than the one this host "
                    "registered with (a cluster started anew?); connect the client again"
                )
            return tenant, None
        if role == "host":
            if not token_matches(token, host_token(secret)):
                return HOST, (
                    f"the hello's token is not a host's of host {self.host}'s controller: "
                    "the sender registered with another controller"
                )
            return HOST, None
        return HOST, f"a hello's role is 'client' or 'host'; got {role!r}"

    def refusal(self, identity: bytes, kind: str, h: dict[str, Any]) -> str | None:
        """Why the request ``h`` on connection ``identity`` is refused, or None if it
        may go on: the connection said hello, and a client names only its own arrays."""
        peer = self._by_identity.get(identity)
        if peer is None:
            return "say hello before anything else"
        if kind not in CLIENT_REQUESTS:  # a transfer's piece
            return None if peer == HOST else f"only hosts send {kind!r} messages"
        if peer == HOST:
            return f"a host sends only transfers here; got {kind!r}"
        field = CLIENT_REQUESTS[kind]
        if field is None:
            return None
        named = h.get(field)
        # Malformed lists are the request's own checks to explain.
        ids = [x for x in named if type(x) is int] if type(named) is list else [named]
        bad = foreign(ids, peer)
        return None if bad is None else f"{kind}: " + describe_foreign("array", bad, peer)

    def tenant(self, identity: bytes) -> int:
        """The tenant connection ``identity`` proved to be (:data:`HOST` for a host)."""
        return self._by_identity.get(identity, HOST)

    def forget(self, identity: bytes) -> None:
        self._by_identity.pop(identity, None)
