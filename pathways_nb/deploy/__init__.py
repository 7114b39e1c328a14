"""Deployment: the Dask preloads, ``LocalCluster``, the in-process cluster and the CLI.

``pathways_nb.deploy.scheduler`` and ``pathways_nb.deploy.worker`` are Dask preload
modules; importing them must stay light, so the names here load lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["InProcessCluster", "LocalCluster"]

_LAZY = {
    "InProcessCluster": "pathways_nb.deploy._inprocess",
    "LocalCluster": "pathways_nb.deploy._local",
}

if TYPE_CHECKING:
    from pathways_nb.deploy._inprocess import InProcessCluster
    from pathways_nb.deploy._local import LocalCluster


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pathways_nb.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
