"""Dask scheduler preload: host the pathways controller in the scheduler process.

    dask scheduler --preload pathways_nb.deploy.scheduler

Imports only what the controller needs (no client, pandas, IPython, widgets or JAX).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from distributed.comm import get_address_host
from distributed.diagnostics.plugin import SchedulerPlugin

from pathways_nb._core import TLS_PREFIX, TLSContexts
from pathways_nb.controller import Controller
from pathways_nb.deploy._watch import remove_cluster_dir, watch_parent

log = logging.getLogger("pathways_nb.deploy")


class ControllerPlugin(SchedulerPlugin):
    """Starts the controller with the scheduler, feeds it worker departures."""

    name = "pathways-controller"

    def __init__(self) -> None:
        self.controller: Controller | None = None

    async def start(self, scheduler: Any) -> None:
        host = get_address_host(scheduler.address) or "127.0.0.1"
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        tls = None
        if scheduler.address.startswith(TLS_PREFIX):
            # A scheduler secured with TLS: the controller listens with its certificate.
            tls = TLSContexts.from_security(scheduler.security, "scheduler", listen=True).server
        self.controller = Controller(bind_host=host, tls=tls).start()
        scheduler.handlers["pathways_controller"] = self._info
        log.info("pathways controller listening at %s", self.controller.client_address)

        def parent_gone() -> None:
            log.warning("the process that started this cluster is gone; shutting down")
            remove_cluster_dir()
            os._exit(0)

        watch_parent(parent_gone)

    def _info(self) -> dict[str, Any]:
        assert self.controller is not None
        stats = self.controller.statistics()
        return {
            "address": self.controller.client_address,
            "host_address": self.controller.host_address,
            "live_hosts": stats.live_hosts,
            "version": self.controller.versions.package,
        }

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        if self.controller is not None:
            self.controller.host_lost(worker, "the Dask scheduler removed its worker")

    async def close(self) -> None:
        if self.controller is not None:
            self.controller.stop()


async def dask_setup(scheduler: Any) -> None:
    """Preload hook: install the controller plugin."""
    scheduler.add_plugin(ControllerPlugin())
