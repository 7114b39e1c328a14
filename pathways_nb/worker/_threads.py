"""The JAX configuration a host's threads run under, wherever the host runs.

A host in a worker process of its own sets it for the whole process (see
``pathways_nb.deploy.worker``). A host in the client's process (``pw.InProcessCluster``)
shares that process's configuration, and a client's setting in a context
(``with jax.enable_x64(True):``) holds in the client's thread only. Each host thread
therefore runs its loop in contexts of its own:

- 64-bit types on: the clients decide every dtype, and a host without them would hold a
  64-bit client's float64 put as float32, silently, and could not call its programs;
- JAX's NaN and infinity checks off: a client's ``jax_debug_nans`` asks for the host's
  own check of that client's launches (see :mod:`pathways_nb.worker._finite`); JAX's
  would fail every tenant's programs with its internal exception.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax


def as_host(target: Callable[[], None]) -> Callable[[], None]:
    """``target`` run under a host's JAX configuration in its thread."""

    @functools.wraps(target)
    def run() -> None:
        with jax.enable_x64(True), jax.debug_nans(False), jax.debug_infs(False):
            target()

    return run
