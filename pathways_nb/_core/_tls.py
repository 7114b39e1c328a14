"""Which TLS context each link of a process uses, taken from the Dask cluster's security.

A cluster whose Dask scheduler listens on ``tls://`` encrypts the pathways links too:
the controller's and each host's endpoints listen with TLS (addresses ``tls://HOST:PORT``)
and every process dials them with the certificate Dask gave it. The certificates are
Dask's own (``distributed.Security``, from ``dask scheduler --tls-cert ...``, Dask's
configuration ``distributed.comm.tls.*``, or ``Security.temporary()``), so a cluster
secured for Dask needs nothing more for pathways. Without TLS nothing changes.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from pathways_nb._core._errors import BrokenError

TLS_PREFIX = "tls://"


@dataclass(frozen=True)
class TLSContexts:
    """The TLS of one process: ``server`` for the endpoints it listens on (None: it
    listens in the clear), ``client`` for those it dials, and whether it ``required``
    encryption (Dask's ``require_encryption``), so that it refuses a plain address."""

    server: ssl.SSLContext | None = None
    client: ssl.SSLContext | None = None
    required: bool = False

    @classmethod
    def from_security(cls, security: Any, role: str, *, listen: bool) -> TLSContexts:
        """The contexts of a Dask ``Security`` for ``role`` ("scheduler", "worker" or
        "client"); ``listen`` when the process also listens (the controller, a host).
        ValueError when the security holds no certificate for that role."""
        check_security(security)
        client = security.get_connection_args(role).get("ssl_context")
        server = security.get_listen_args(role).get("ssl_context") if listen else None
        if client is None or (listen and server is None):
            raise ValueError(
                f"the cluster uses TLS, but its distributed.Security holds no {role} "
                "certificate: give one (tls_ca_file= and the "
                f"tls_{role}_cert=/tls_{role}_key= of {role}s), or set "
                "distributed.comm.tls.* in Dask's configuration"
            )
        return cls(server=server, client=client, required=bool(security.require_encryption))

    def for_address(self, address: str, peer: str = "the peer") -> ssl.SSLContext | None:
        """The context for dialing ``address`` (None for a plain one). BrokenError (the
        link cannot be made) for a ``tls://`` address without a client context, or a
        plain network address when encryption is required."""
        if address.startswith(TLS_PREFIX):
            if self.client is None:
                raise BrokenError(missing_tls(address, peer))
            return self.client
        if self.required and not address.startswith("inproc://"):
            raise BrokenError(
                f"{peer} at {address} does not use TLS, and this process's "
                "distributed.Security requires encryption: connect to a cluster started "
                "with TLS, or use a Security with require_encryption=False"
            )
        return None


NO_TLS = TLSContexts()


def check_security(security: object) -> None:
    """TypeError unless ``security`` is a ``distributed.Security`` (or acts as one)."""
    if not callable(getattr(security, "get_connection_args", None)):
        raise TypeError(
            "security is a distributed.Security (e.g. Security(tls_ca_file=..., "
            "tls_client_cert=..., tls_client_key=...) or Security.temporary()); "
            f"got {type(security).__name__}"
        )


def missing_tls(address: str, peer: str = "the cluster") -> str:
    """What to say when ``peer`` at ``address`` speaks TLS and no context was given."""
    return (
        f"{peer} at {address} uses TLS, and no certificate was given for it: pass "
        "pw.Client(..., security=distributed.Security(tls_ca_file=..., tls_client_cert=..., "
        "tls_client_key=...)) with the cluster's CA and a client certificate, or set "
        "distributed.comm.tls.* in Dask's configuration"
    )
