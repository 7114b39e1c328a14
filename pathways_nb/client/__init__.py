"""The client: a notebook's session, virtual slices, remote arrays and ``pw.jit``."""

from pathways_nb.client._export import TraceError
from pathways_nb.client._futures import Future
from pathways_nb.client._graph import DataflowGraph, GraphArray
from pathways_nb.client._jit import RemoteFunction, jit
from pathways_nb.client._pipeline import Pipeline, pipeline
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._session import Client, block_until_ready, fetch, graph
from pathways_nb.client._shards import RemoteShard
from pathways_nb.client._slice import VirtualDevice, VirtualSlice
from pathways_nb.client._status import EventRows, Status

__all__ = [
    "Client",
    "DataflowGraph",
    "EventRows",
    "Future",
    "GraphArray",
    "Pipeline",
    "RemoteArray",
    "RemoteFunction",
    "RemoteShard",
    "Status",
    "TraceError",
    "VirtualDevice",
    "VirtualSlice",
    "block_until_ready",
    "fetch",
    "graph",
    "jit",
    "pipeline",
]
