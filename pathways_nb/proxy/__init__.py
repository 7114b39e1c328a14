"""Plain JAX on a pathways_nb cluster, through JAX's IFRT proxy client.

``pathways-nb proxy`` (or :func:`serve`) starts a gRPC server speaking the protocol of
``jax.extend.backend.ifrt_proxy``; a JAX process started with ``JAX_PLATFORMS=proxy``
and ``JAX_BACKEND_TARGET=grpc://HOST:PORT`` then runs on the cluster's devices, each of
its sessions a tenant of the cluster.
"""

from pathways_nb.proxy._kernel import ProxyProcess, stop_jax, use_jax
from pathways_nb.proxy._serve import backend_factory, check_cluster, serve
from pathways_nb.proxy._server import ProxyServer

__all__ = [
    "ProxyProcess",
    "ProxyServer",
    "backend_factory",
    "check_cluster",
    "serve",
    "stop_jax",
    "use_jax",
]
