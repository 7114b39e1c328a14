"""Dask tasks that run in a worker process beside its pathways host."""

from __future__ import annotations

from typing import Any


def store_on_host(value: Any, header: dict[str, Any], host: str) -> None:
    """Hand ``value``, computed on this Dask worker, to the pathways host running in
    the same process, for the put ``header`` describes. Returns nothing, so Dask keeps
    no second copy of the array once the host has it."""
    from distributed import get_worker

    from pathways_nb.deploy.worker import running_host

    worker = get_worker()
    here = running_host(worker)
    if here is None or here.name != host:
        raise RuntimeError(
            f"the Dask worker {worker.address} runs "
            + ("no pathways host" if here is None else f"pathways host {here.name}")
            + f", not host {host} that this put is for: start the cluster's workers with "
            "`--preload pathways_nb.deploy.worker`, and put on slices of this cluster"
        )
    here.store_fed(header, value)
