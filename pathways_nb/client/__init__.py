"""The client: a notebook's session, virtual slices, remote arrays and ``pw.jit``."""

from pathways_nb.client._checkpoint import Saving, restore, save
from pathways_nb.client._colocated import ColocatedFunction, colocated
from pathways_nb.client._export import TraceError
from pathways_nb.client._futures import Future
from pathways_nb.client._graph import DataflowGraph, GraphArray
from pathways_nb.client._jit import RemoteFunction, jit
from pathways_nb.client._pipeline import Pipeline, pipeline
from pathways_nb.client._profile import HostTrace, Profile
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._session import Client, graph
from pathways_nb.client._shards import RemoteShard
from pathways_nb.client._slice import VirtualDevice, VirtualSlice
from pathways_nb.client._status import EventRows, Status
from pathways_nb.client._waiting import (
    AsCompleted,
    DoneAndNotDone,
    as_completed,
    block_until_ready,
    fetch,
    wait,
)

__all__ = [
    "AsCompleted",
    "Client",
    "ColocatedFunction",
    "DataflowGraph",
    "DoneAndNotDone",
    "EventRows",
    "Future",
    "GraphArray",
    "HostTrace",
    "Pipeline",
    "Profile",
    "RemoteArray",
    "RemoteFunction",
    "RemoteShard",
    "Saving",
    "Status",
    "TraceError",
    "VirtualDevice",
    "VirtualSlice",
    "as_completed",
    "block_until_ready",
    "colocated",
    "fetch",
    "graph",
    "jit",
    "pipeline",
    "restore",
    "save",
    "wait",
]
