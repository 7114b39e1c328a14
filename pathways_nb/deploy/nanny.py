"""Dask nanny preload: stop the nanny when the process that started the cluster dies."""

from __future__ import annotations

import os
from typing import Any

from pathways_nb.deploy._watch import watch_parent


async def dask_setup(nanny: Any) -> None:
    """Preload hook: watch ``$PATHWAYS_PARENT_PID``."""

    def gone() -> None:
        # The worker process is the nanny's child; killing the group takes it along.
        try:
            os.killpg(os.getpgid(0), 15)
        finally:
            os._exit(0)

    watch_parent(gone)
