"""Exit when the process that started us is gone, so a killed kernel leaves no orphans."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable

PARENT_ENV = "PATHWAYS_PARENT_PID"
# The folder of a LocalCluster's logs and scheduler file, given to its scheduler: when the
# process that made it is gone, nobody else will remove it.
CLUSTER_DIR_ENV = "PATHWAYS_CLUSTER_DIR"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_parent(on_gone: Callable[[], None], interval: float = 1.0) -> threading.Thread | None:
    """Call ``on_gone()`` once the pid in ``$PATHWAYS_PARENT_PID`` has exited."""
    raw = os.environ.get(PARENT_ENV)
    if not raw:
        return None
    pid = int(raw)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval):
            if not _alive(pid):
                on_gone()
                return

    t = threading.Thread(target=run, name="pathways-parent-watch", daemon=True)
    t.start()
    return t


def remove_cluster_dir() -> None:
    """Remove ``$PATHWAYS_CLUSTER_DIR`` (the scheduler does, once its parent is gone)."""
    path = os.environ.get(CLUSTER_DIR_ENV)
    if path:
        shutil.rmtree(path, ignore_errors=True)
