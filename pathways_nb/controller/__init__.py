"""The controller: resource manager, gang schedulers, tenants and the event log.

Runs inside the Dask scheduler process (see ``pathways_nb.deploy.scheduler``) or, in the
in-process test tier, beside the hosts and the client. Never imports the client.
"""

from pathways_nb.controller._events import EventLog
from pathways_nb.controller._resources import HostInfo, ResourceManager, SliceInfo
from pathways_nb.controller._scheduler import GangScheduler, SchedulerStatistics, Work
from pathways_nb.controller._server import Controller, ControllerStatistics
from pathways_nb.controller._tenants import Tenant, Tenants

__all__ = [
    "Controller",
    "ControllerStatistics",
    "EventLog",
    "GangScheduler",
    "HostInfo",
    "ResourceManager",
    "SchedulerStatistics",
    "SliceInfo",
    "Tenant",
    "Tenants",
    "Work",
]
