"""An in-process cluster: controller, hosts and client in one process over ``inproc://``.

The fast test tier, and handy for trying pathways_nb without processes. Each host owns
a disjoint subset of this process's (simulated) devices; they share one XLA process, so
the gang scheduler's window counts them together.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import zmq

from pathways_nb._core import ClosedError, Config
from pathways_nb.controller import Controller
from pathways_nb.worker import Host


class InProcessCluster:
    """``islands`` hosts of ``devices_per_island`` devices each, plus a controller."""

    def __init__(
        self,
        islands: int = 2,
        devices_per_island: int = 2,
        config: Config | None = None,
    ) -> None:
        devices = jax.local_devices()
        need = islands * devices_per_island
        if need > len(devices):
            raise ValueError(
                f"{islands} islands x {devices_per_island} devices need {need} devices; this "
                f"process has {len(devices)}. Set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={need} "
                "before importing jax."
            )
        self.config = config or Config.from_env()
        self.config.check_checkpoint_root()  # its hosts run here
        self.context: zmq.Context[Any] = zmq.Context()
        self.controller = Controller(self.config, context=self.context, inproc=True).start()
        self.hosts: list[Host] = []
        for i in range(islands):
            devs = devices[i * devices_per_island : (i + 1) * devices_per_island]
            self.hosts.append(self._host(i, devs).start())
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False

    def _host(self, i: int, devices: Any) -> Host:
        return Host(
            f"host{i}",
            self.controller.host_address,
            devices=devices,
            island=f"island{i}",
            config=self.config,
            context=self.context,
            inproc=True,
        )

    def restart_host(self, index: int) -> Host:
        """Stop host ``index`` and start a fresh one on its devices under its name, as a
        Dask nanny restarts a worker that died: its arrays are lost, and the controller
        maps its slices onto the new host when it registers."""
        if self._closed:
            raise ClosedError("this in-process cluster was closed; start a new one")
        if not 0 <= index < len(self.hosts):
            raise IndexError(f"host index {index} out of range: the cluster has {len(self.hosts)}")
        old = self.hosts[index]
        old.stop()
        self.hosts[index] = self._host(index, old.devices).start()
        return self.hosts[index]

    @property
    def controller_address(self) -> str:
        return self.controller.client_address

    @property
    def closed(self) -> bool:
        return self._closed

    def client(self, **kwargs: Any) -> Any:
        """A new client connected to this cluster (as ``pw.Client(cluster)``); closing
        the cluster closes it."""
        from pathways_nb.client import Client

        return Client(self, **kwargs)

    def adopt(self, client: Any) -> None:
        """Called by a client connected to this cluster: it closes with the cluster."""
        if self._closed:
            raise ClosedError("this in-process cluster was closed; start a new one")
        self._clients.add(client)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Clients first: they share the ZeroMQ context, whose term() waits for every
        # socket in it to close.
        for client in list(self._clients):
            client.close()
        self.controller.shutting_down()
        for h in self.hosts:
            h.stop()
        self.controller.stop()
        self.context.term()

    def __enter__(self) -> InProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
