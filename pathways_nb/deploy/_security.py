"""TLS for the clusters pathways starts: Dask's certificates, handed to its commands.

``pw.LocalCluster(security=True)`` makes a certificate authority and one certificate for
this cluster alone (``distributed.Security.temporary()``, which needs the
``cryptography`` package), as Dask's own ``LocalCluster(security=True)`` does; a
``distributed.Security`` with certificates of its own is used as given. The scheduler
and worker commands read their certificates from files, so certificates held in memory
are written to the cluster's private folder (mode 0700, removed with the cluster), with
a client certificate beside them: JupyterLab's panel, run by the same user, shows the
cluster with it (see ``lab/_boards.py``).
"""

from __future__ import annotations

import os
from typing import Any

# The Security attributes each command's --tls-* options take, by role.
_ROLE_FILES = {
    "scheduler": ("tls_scheduler_cert", "tls_scheduler_key"),
    "worker": ("tls_worker_cert", "tls_worker_key"),
}


def cluster_security(security: object) -> Any:
    """The ``distributed.Security`` a cluster starts with, or None for none (``security``
    None or False). ``True`` makes temporary certificates. TypeError / ValueError / an
    ImportError saying what to install, for what it cannot use."""
    if security is None or security is False:
        return None
    if security is True:
        from distributed.security import Security

        try:
            return Security.temporary()
        except ImportError:
            raise ImportError(
                "security=True makes this cluster's TLS certificates with the "
                "`cryptography` package: pip install cryptography (or give a "
                "distributed.Security with certificates of your own)"
            ) from None
    if not callable(getattr(security, "get_connection_args", None)):
        raise TypeError(
            "security is True (temporary certificates for this cluster), False, or a "
            f"distributed.Security; got {type(security).__name__}"
        )
    missing = [
        name
        for name in ("tls_ca_file", "tls_client_cert", *_ROLE_FILES["scheduler"])
        + _ROLE_FILES["worker"]
        if not getattr(security, name, None)
    ]
    if missing:
        raise ValueError(
            "a cluster started with TLS needs its CA and a certificate and key for the "
            f"scheduler, the workers and the client; this Security lacks {', '.join(missing)} "
            "(Security.temporary() makes them all)"
        )
    return security


def command_options(security: Any, role: str, folder: str) -> list[str]:
    """The ``dask scheduler`` / ``dask worker`` options that give ``role`` its TLS
    (``--protocol tls`` and the ``--tls-*`` files), writing certificates held in memory
    into ``folder``."""
    cert, key = _ROLE_FILES[role]
    return [
        "--protocol",
        "tls",
        "--tls-ca-file",
        _as_file(security.tls_ca_file, folder, "ca.pem"),
        "--tls-cert",
        _as_file(getattr(security, cert), folder, f"{role}.pem"),
        "--tls-key",
        _as_file(getattr(security, key), folder, f"{role}-key.pem"),
    ]


def _as_file(value: str, folder: str, name: str) -> str:
    """A path to ``value``: itself when it is one, else a file of its PEM text in
    ``folder`` (a cluster's own: a file of that name there already holds it, as the CA
    each role and the client name)."""
    if "-----BEGIN" not in value:
        return value
    path = os.path.join(folder, name)
    if os.path.exists(path):
        return path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return path


# The client's files in a cluster's folder, for other processes of the same user
# (JupyterLab's panel reads them by these names).
_CLIENT_FILES = ("ca.pem", "client.pem", "client-key.pem")


def write_client_files(security: Any, folder: str) -> None:
    """Put the CA and the client certificate of ``security`` in ``folder``."""
    for value, name in zip(
        (security.tls_ca_file, security.tls_client_cert, security.tls_client_key),
        _CLIENT_FILES,
        strict=True,
    ):
        if "-----BEGIN" in value:
            _as_file(value, folder, name)
        else:
            with open(value) as f:
                _as_file(f.read(), folder, name)


def client_files(folder: str) -> dict[str, str]:
    """The client's files :func:`write_client_files` put in ``folder``, by the names a
    ``distributed.Security`` takes them (``tls_ca_file``, ``tls_client_cert``,
    ``tls_client_key``)."""
    keys = ("tls_ca_file", "tls_client_cert", "tls_client_key")
    return {k: os.path.join(folder, name) for k, name in zip(keys, _CLIENT_FILES, strict=True)}
