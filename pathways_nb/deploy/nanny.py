"""Dask nanny preload: stop the nanny when the process that started the cluster dies, and
spawn the worker without Dask's malloc trim threshold.

Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_=65536`` in the worker it spawns, to hand
freed memory back to the OS sooner. Any explicit trim threshold also freezes glibc's
mmap threshold, so every buffer XLA allocates above 128 KiB is a fresh mmap with its
page faults: programs ran 2.4x slower here. Preloads run before the nanny reads its
``pre-spawn-environ``, so dropping the variable here reaches the worker.
"""

from __future__ import annotations

import os
from typing import Any

import dask

from pathways_nb.deploy._watch import watch_parent

# None removes the variable from what the nanny sets (distributed's documented way).
dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)


async def dask_setup(nanny: Any) -> None:
    """Preload hook: watch ``$PATHWAYS_PARENT_PID``."""

    def gone() -> None:
        # The worker process is the nanny's child; killing the group takes it along.
        try:
            os.killpg(os.getpgid(0), 15)
        finally:
            os._exit(0)

    watch_parent(gone)
