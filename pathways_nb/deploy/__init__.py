"""Deployment: the Dask preloads, ``LocalCluster``, the in-process cluster and the CLI.

``pathways_nb.deploy.scheduler`` and ``pathways_nb.deploy.worker`` are Dask preload
modules; import them by name (this package does not import them).
"""

from pathways_nb.deploy._inprocess import InProcessCluster
from pathways_nb.deploy._local import LocalCluster

__all__ = ["InProcessCluster", "LocalCluster"]
