"""Finding the controller behind a Dask scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from typing import Any

from pathways_nb._core import (
    NO_TLS,
    TLS_PREFIX,
    BrokenError,
    TLSContexts,
    check_security,
    missing_tls,
)

# Seconds Dask's connect is given before a probe says whether anything listens there.
_PROBE_SECONDS = 2.0


def security_for(address: str, security: Any = None) -> Any:
    """The ``distributed.Security`` to reach a cluster at ``address`` with, or None for
    the clear: ``security`` when given (a cluster object's own, or the caller's), else
    for a ``tls://`` address Dask's configured default (``distributed.comm.tls.*``).
    ValueError for a ``tls://`` address with no client certificate to show."""
    if security is not None:
        check_security(security)
    elif not address.startswith(TLS_PREFIX):
        return None
    else:
        from distributed.security import Security

        security = Security()
    has_certificate = security.get_connection_args("client").get("ssl_context") is not None
    if address.startswith(TLS_PREFIX) and not has_certificate:
        raise ValueError(missing_tls(address))
    # A Security without certificates (a plain Dask cluster's) asks for nothing more,
    # unless it requires encryption: then the plain links are refused as they are made.
    return security if has_certificate or security.require_encryption else None


def client_tls(security: Any) -> TLSContexts:
    """The contexts a client dials with: none without ``security``."""
    if security is None:
        return NO_TLS
    # One context, made here: a client listens nowhere, and a Security without a client
    # certificate (a plain cluster's that requires encryption) dials nothing over TLS.
    context = security.get_connection_args("client").get("ssl_context")
    return TLSContexts(client=context, required=bool(security.require_encryption))


def ask_scheduler(
    address: str, timeout: float = 30.0, probe: bool = True, security: Any = None
) -> dict[str, Any]:
    """Ask a Dask scheduler with the pathways preload about its controller.

    With ``probe``, a connection that fails within a few seconds is followed by a check
    that something listens there, so that a stopped cluster is said within seconds (Dask
    would retry a refused connection for its whole timeout). The check runs only then:
    the scheduler logs each such probe as a connection closed before its handshake.
    ``security`` is the cluster's ``distributed.Security`` when it uses TLS (see
    :func:`security_for`).
    """
    args = security.get_connection_args("client") if security is not None else {}
    first = min(timeout, _PROBE_SECONDS) if probe else timeout
    result = _ask(address, first, args)
    if probe and isinstance(result.get("error"), TimeoutError | OSError):
        _refused_at_once(address)
        if timeout > first:
            result = _ask(address, timeout, args)
    return _controller_info(address, result, timeout)


def _ask(address: str, timeout: float, connection_args: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's answer about its controller (``info``), or the ``error`` met."""
    from distributed.core import rpc

    result: dict[str, Any] = {}

    async def ask() -> None:
        r = rpc(address, timeout=timeout, connection_args=connection_args)
        try:
            result["info"] = await asyncio.wait_for(r.pathways_controller(), timeout)
        finally:
            await r.close_rpc()

    def run() -> None:
        try:
            asyncio.run(ask())
        except Exception as exc:
            result["error"] = exc

    # A notebook kernel already runs an event loop in this thread: ask from a fresh one.
    t = threading.Thread(target=run, name="pathways-ask-scheduler")
    t.start()
    t.join()
    return result


def _controller_info(address: str, result: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The controller's info from ``_ask``'s result, or a BrokenError saying what failed."""
    if "error" in result:
        exc = result["error"]
        if isinstance(exc, TimeoutError | OSError):
            what = f"nothing answered at {address} within {timeout:.0f} s"
            if not isinstance(exc, TimeoutError) and str(exc):
                what = f"could not reach {address} ({exc})"
            raise BrokenError(
                f"{what}: is the cluster running, and is that its Dask scheduler's address? "
                "Start one with `pathways-nb cluster`, pw.LocalCluster(...), or "
                "`dask scheduler --preload pathways_nb.deploy.scheduler` beside "
                "`dask worker --preload pathways_nb.deploy.worker`."
            ) from None
        if isinstance(exc, MemoryError):
            # Dask's framing read a length from bytes that are not Dask's: another kind
            # of server listens there.
            raise BrokenError(
                f"something answered at {address}, but not as a Dask scheduler does (its "
                f"reply read as a message of impossible size: {exc}): check the address "
                "and port, such as tcp://SCHEDULER:8786"
            ) from None
        raise BrokenError(
            f"could not get the pathways controller from the Dask scheduler at {address}: "
            f"{type(exc).__name__}: {exc}. Start the scheduler with "
            "`dask scheduler --preload pathways_nb.deploy.scheduler`."
        ) from None
    info = result.get("info")
    if not isinstance(info, dict) or "address" not in info:
        # Dask answers an operation it has no handler for with nothing at all.
        raise BrokenError(
            f"the Dask scheduler at {address} runs no pathways controller: it was started "
            "without the preload. Start it with "
            "`dask scheduler --preload pathways_nb.deploy.scheduler` (and its workers with "
            "`dask worker --preload pathways_nb.deploy.worker`), or use `pathways-nb cluster`."
        )
    return dict(info)


def _refused_at_once(address: str) -> None:
    """Raise BrokenError if nothing listens at a TCP ``address`` (a stale scheduler file,
    a cluster that stopped): Dask's connect would retry a refused connection for its
    whole timeout, 30 s by default, before saying so. Other outcomes are left to Dask."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        return  # Dask says what is wrong with it
    try:
        socket.create_connection((host, port), timeout=_PROBE_SECONDS).close()
    except ConnectionRefusedError:
        raise BrokenError(
            f"nothing listens at {address} (connection refused): is the cluster running, "
            "and is that its Dask scheduler's address (a scheduler file can outlive its "
            "cluster)? Start one with `pathways-nb cluster`, pw.LocalCluster(...), or "
            "`dask scheduler --preload pathways_nb.deploy.scheduler` beside "
            "`dask worker --preload pathways_nb.deploy.worker`."
        ) from None
    except socket.gaierror as exc:
        raise BrokenError(
            f"the scheduler address {address} names a host that does not resolve "
            f"({exc.strerror or exc}): check its spelling, or use the IP address"
        ) from None
    except OSError:
        return  # unreachable for now: Dask tries for its own timeout


def address_from_file(path: str | os.PathLike[str]) -> str:
    """The scheduler address in a scheduler file: the JSON that ``pathways-nb cluster
    --scheduler-file`` and ``dask scheduler --scheduler-file`` write."""
    try:
        with open(path) as f:
            address = json.load(f)["address"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"cannot read a scheduler address from {os.fspath(path)!r} ({exc}); a scheduler "
            "file is the JSON `pathways-nb cluster --scheduler-file` or "
            "`dask scheduler --scheduler-file` writes"
        ) from None
    if not isinstance(address, str):
        raise ValueError(f"the address in {os.fspath(path)!r} is not a string: {address!r}")
    return address


def security_from_file(path: str | os.PathLike[str]) -> Any:
    """The ``distributed.Security`` a scheduler file names for clients (``pathways-nb
    cluster --tls`` writes its client certificate's files there), or None."""
    try:
        with open(path) as f:
            files = json.load(f).get("tls")
    except (OSError, ValueError, AttributeError):
        return None  # address_from_file says what is wrong with the file
    if not isinstance(files, dict):
        return None
    from distributed.security import Security

    keys = ("tls_ca_file", "tls_client_cert", "tls_client_key")
    return Security(**{k: str(files[k]) for k in keys if k in files})
