"""Keys that let a host tell who is talking to it.

The controller makes a random secret when it starts and gives it to each host as it
registers. A client gets a token for its tenant id in the controller's welcome (the
secret's HMAC of that id), and a host sending a transfer to another host the token for
hosts; each shows its token in the hello that opens a connection to a host's data plane.
A host checks the token against the secret, and from then on serves that connection
only the arrays of the tenant it proved to be: a client cannot claim another tenant's
id, nor a peer that never heard from the controller a host's.

The tokens travel as the rest of the protocol does: a network that can be read can
read them. They keep tenants' arrays apart; keeping them secret from the network needs
encrypted links.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def tenant_token(secret: bytes, tenant: int) -> bytes:
    """What tenant ``tenant`` shows a host."""
    return hmac.new(secret, b"tenant:%d" % tenant, hashlib.sha256).digest()


def host_token(secret: bytes) -> bytes:
    """What a host shows another host it sends arrays to."""
    return hmac.new(secret, b"host", hashlib.sha256).digest()


def token_matches(token: object, expected: bytes) -> bool:
    return type(token) is bytes and hmac.compare_digest(token, expected)
