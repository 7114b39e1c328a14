"""Dask nanny preload: stop the nanny when the process that started the cluster dies, and
spawn the worker with the C allocator set for XLA's buffers.

Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_=65536`` in the worker it spawns, to hand
freed memory back to the OS sooner. Any explicit trim threshold also freezes glibc's
mmap threshold, so every buffer XLA allocates above 128 KiB is a fresh mmap with its
page faults: programs ran 2.4x slower here. Preloads run before the nanny reads its
``pre-spawn-environ``, so dropping the variable here reaches the worker. The worker also
starts with glibc mapping large buffers with huge pages (see ``_malloc``).
"""

from __future__ import annotations

import os
from typing import Any

import dask

from pathways_nb.deploy._malloc import with_huge_pages
from pathways_nb.deploy._watch import watch_parent

# None removes the variable from what the nanny sets (distributed's documented way).
dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
# The worker is spawned with this process's environment.
os.environ["GLIBC_TUNABLES"] = with_huge_pages(os.environ.get("GLIBC_TUNABLES"))


async def dask_setup(nanny: Any) -> None:
    """Preload hook: watch ``$PATHWAYS_PARENT_PID``."""

    def gone() -> None:
        # The worker process is the nanny's child; killing the group takes it along.
        try:
            os.killpg(os.getpgid(0), 15)
        finally:
            os._exit(0)

    watch_parent(gone)
