"""pathways_nb: a Pathways-style single-controller runtime for JAX, driven from Jupyter.

>>> import pathways_nb as pw
>>> with pw.LocalCluster(islands=2, devices_per_island=4) as cluster:
...     client = pw.Client(cluster)
...     vs = client.allocate({"data": 4})

Names load lazily, so the Dask preload modules (``pathways_nb.deploy.scheduler``,
``pathways_nb.deploy.worker``) import neither the client, pandas, IPython nor widgets.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "Client": "pathways_nb.client",
    "ColocatedFunction": "pathways_nb.client",
    "colocated": "pathways_nb.client",
    "DataflowGraph": "pathways_nb.client",
    "GraphArray": "pathways_nb.client",
    "Pipeline": "pathways_nb.client",
    "Profile": "pathways_nb.client",
    "pipeline": "pathways_nb.client",
    "graph": "pathways_nb.client",
    "RemoteArray": "pathways_nb.client",
    "RemoteFunction": "pathways_nb.client",
    "Status": "pathways_nb.client",
    "TraceError": "pathways_nb.client",
    "VirtualSlice": "pathways_nb.client",
    "VirtualDevice": "pathways_nb.client",
    "RemoteShard": "pathways_nb.client",
    "fetch": "pathways_nb.client",
    "block_until_ready": "pathways_nb.client",
    "wait": "pathways_nb.client",
    "save": "pathways_nb.client",
    "restore": "pathways_nb.client",
    "as_completed": "pathways_nb.client",
    "jit": "pathways_nb.client",
    "use_jax": "pathways_nb.proxy",
    "stop_jax": "pathways_nb.proxy",
    "LocalCluster": "pathways_nb.deploy",
    "InProcessCluster": "pathways_nb.deploy",
    "Config": "pathways_nb._core",
    "PathwaysError": "pathways_nb._core",
    "RemoteError": "pathways_nb._core",
    "DataLossError": "pathways_nb._core",
    "NonFiniteError": "pathways_nb._core",
    "ResourceExhaustedError": "pathways_nb._core",
    "ClosedError": "pathways_nb._core",
    "BrokenError": "pathways_nb._core",
    "BusyError": "pathways_nb._core",
    "CancelledError": "pathways_nb._core",
    "ProtocolError": "pathways_nb._core",
    "VersionMismatchError": "pathways_nb._core",
}

__all__ = sorted([*_LAZY, "__version__", "data", "viz"])

if TYPE_CHECKING:
    from pathways_nb import data, viz
    from pathways_nb._core import (
        BrokenError,
        BusyError,
        CancelledError,
        ClosedError,
        Config,
        DataLossError,
        NonFiniteError,
        PathwaysError,
        ProtocolError,
        RemoteError,
        ResourceExhaustedError,
        VersionMismatchError,
    )
    from pathways_nb.client import (
        Client,
        ColocatedFunction,
        DataflowGraph,
        GraphArray,
        Pipeline,
        Profile,
        RemoteArray,
        RemoteFunction,
        RemoteShard,
        Status,
        TraceError,
        VirtualDevice,
        VirtualSlice,
        as_completed,
        block_until_ready,
        colocated,
        fetch,
        graph,
        jit,
        pipeline,
        restore,
        save,
        wait,
    )
    from pathways_nb.deploy import InProcessCluster, LocalCluster
    from pathways_nb.proxy import stop_jax, use_jax


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext pathways_nb``: the ``%pathways`` magics."""
    from pathways_nb._magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    from pathways_nb._magics import unload_ipython_extension as unload

    unload(ip)


def __getattr__(name: str) -> Any:
    if name in ("data", "viz"):
        value = importlib.import_module(f"pathways_nb.{name}")
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pathways_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
