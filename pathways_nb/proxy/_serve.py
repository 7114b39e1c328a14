"""A proxy in front of a cluster: each IFRT session a ``pw.Client`` of its own."""

from __future__ import annotations

from typing import Any

from pathways_nb.proxy._cluster import ClusterBackend
from pathways_nb.proxy._server import ProxyServer


def backend_factory(
    address: Any = None,
    *,
    scheduler_file: str | None = None,
    name: str = "",
    weight: float = 1.0,
    islands: int | None = None,
) -> Any:
    """Makes a session's backend: a ``pw.Client`` of the cluster at ``address`` (or
    ``scheduler_file``), named ``name`` with ``weight`` unless the session's
    initialization data names its own (``name``, ``weight``), holding one slice per
    island (the first ``islands`` of them, if given)."""

    def make(init: dict[str, Any]) -> ClusterBackend:
        from pathways_nb.client import Client

        tenant = str(init.get("name") or name)
        w = init.get("weight", weight)
        client = Client(
            address,
            scheduler_file=scheduler_file,
            name=tenant,
            weight=float(w) if isinstance(w, int | float) else weight,
        )
        backend = ClusterBackend(client, tenant)
        try:
            backend.allocate(islands)
        except BaseException:
            client.close()
            raise
        return backend

    return make


def serve(
    address: Any = None,
    *,
    scheduler_file: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str = "",
    weight: float = 1.0,
    islands: int | None = None,
) -> ProxyServer:
    """Start an IFRT proxy for the cluster at ``address`` (a ``pw.LocalCluster``, a
    scheduler address) or ``scheduler_file``; returns the running server (its ``port``).

    The JAX client speaks gRPC without TLS, so the proxy listens on ``127.0.0.1`` unless
    told otherwise; run it beside the JAX process it serves."""
    server = ProxyServer(
        backend_factory(
            address, scheduler_file=scheduler_file, name=name, weight=weight, islands=islands
        ),
        f"{host}:{int(port)}",
    )
    server.start()
    return server


def check_cluster(address: Any = None, scheduler_file: str | None = None) -> int:
    """The number of islands of the cluster at ``address`` (or ``scheduler_file``),
    asked as an observer; raises the client's error when it cannot be reached."""
    from pathways_nb.client import Client

    with Client(
        None if scheduler_file else address,
        scheduler_file=scheduler_file,
        name="pathways-nb proxy",
        observer=True,
    ) as client:
        return len(client.status().rows["islands"])
