"""Finding the controller behind a Dask scheduler."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pathways_nb._core import BrokenError


def ask_scheduler(address: str, timeout: float = 30.0) -> dict[str, Any]:
    """Ask a Dask scheduler with the pathways preload about its controller."""
    from distributed.core import rpc

    result: dict[str, Any] = {}

    async def ask() -> None:
        r = rpc(address)
        try:
            result["info"] = await asyncio.wait_for(r.pathways_controller(), timeout)
        finally:
            await r.close_rpc()

    def run() -> None:
        try:
            asyncio.run(ask())
        except Exception as exc:
            result["error"] = exc

    # A notebook kernel already runs an event loop in this thread: ask from a fresh one.
    t = threading.Thread(target=run, name="pathways-ask-scheduler")
    t.start()
    t.join()
    if "error" in result:
        exc = result["error"]
        raise BrokenError(
            f"could not get the pathways controller from the Dask scheduler at {address}: "
            f"{type(exc).__name__}: {exc}. Start the scheduler with "
            "`dask scheduler --preload pathways_nb.deploy.scheduler`."
        ) from None
    return dict(result["info"])
