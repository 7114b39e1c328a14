"""A worker host: executor, object store and data plane.

Runs inside a Dask worker process (see ``pathways_nb.deploy.worker``) or, in the
in-process test tier, beside the controller. Never imports the client.
"""

from pathways_nb.worker._executor import Executor, ExecutorStatistics
from pathways_nb.worker._server import Host
from pathways_nb.worker._store import ObjectStore, StoreStatistics

__all__ = ["Executor", "ExecutorStatistics", "Host", "ObjectStore", "StoreStatistics"]
