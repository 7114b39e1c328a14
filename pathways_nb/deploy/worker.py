"""Dask worker preload: run a pathways host in the worker process.

    dask worker SCHEDULER --preload pathways_nb.deploy.worker

``PATHWAYS_CPU_DEVICES=N`` gives the host N simulated CPU devices (set before JAX
starts). The island is the worker's ``--name`` (stable across nanny restarts).
Imports no client, pandas, IPython or widgets.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("pathways_nb.deploy")

_HOST_ATTR = "_pathways_host"
# Logged, with the traceback, when a host cannot start: pw.LocalCluster finds the cause
# after it in the worker's log.
HOST_FAILED = "did not start; closing the worker"
_TASK_ATTR = "_pathways_host_start"


def cpu_devices(environ: Mapping[str, str]) -> int | None:
    """The simulated CPU devices ``PATHWAYS_CPU_DEVICES`` asks for; None where unset.

    Checked here, before JAX starts: JAX takes -1 as its default of one device and fails
    at 0 with an error that names neither the variable nor the value.
    """
    raw = environ.get("PATHWAYS_CPU_DEVICES", "")
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            "environment variable PATHWAYS_CPU_DEVICES must be a whole number of simulated "
            f"CPU devices for this host, 1 or more (such as 4); got {raw!r}"
        )
    return n


def _configure_jax() -> None:
    import jax

    if os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        log.warning(
            "MALLOC_TRIM_THRESHOLD_=%s is set in this worker (Dask's nanny sets it by "
            "default): XLA's buffers then cost fresh page faults and programs run ~2x "
            "slower. Start workers with --preload-nanny pathways_nb.deploy.nanny, or set "
            "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_ to null.",
            os.environ["MALLOC_TRIM_THRESHOLD_"],
        )

    # The clients decide every dtype (a put's, a program's arguments'): a client with
    # jax_enable_x64 puts and traces 64-bit arrays, which a host without it would
    # silently hold as 32-bit ones, and whose programs it could not call. A 32-bit
    # client's arrays and programs name their 32-bit dtypes, so nothing changes for it.
    jax.config.update("jax_enable_x64", True)
    n = cpu_devices(os.environ)
    if n is not None:
        jax.config.update("jax_num_cpu_devices", n)
    cache = os.environ.get(
        "PATHWAYS_COMPILATION_CACHE", os.path.expanduser("~/.cache/pathways_nb/jax")
    )
    if cache and cache != "0":
        jax.config.update("jax_compilation_cache_dir", cache)
        # Every program: a host that restarts (or a remapped slice) recompiles nothing.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def running_host(worker: Any) -> Any:
    """The pathways host serving in this Dask worker's process, or None (not started,
    or not a worker with this preload)."""
    return getattr(worker, _HOST_ATTR, None)


async def dask_setup(worker: Any) -> None:
    """Preload hook: start the host once the Dask worker runs, and register it.

    The host registers only after the worker (and so its nanny) has finished starting: a
    host the controller lists must be one the nanny will restart if it dies.
    """
    from distributed.core import Status

    loop = asyncio.get_running_loop()

    def start(info: dict[str, Any]) -> Any:
        from pathways_nb._core import NO_TLS, TLS_PREFIX, TLSContexts
        from pathways_nb.worker import Host

        _configure_jax()
        island = str(worker.name) if worker.name is not None else worker.address
        tls = NO_TLS
        if worker.address.startswith(TLS_PREFIX):
            # A worker secured with TLS: its host listens and dials with its certificate.
            tls = TLSContexts.from_security(worker.security, "worker", listen=True)
        host = Host(
            worker.address,
            info["host_address"],
            island=island,
            bind_host=worker.ip or "127.0.0.1",
            own_process=True,
            tls=tls,
        )
        return host.start()

    async def start_when_running() -> None:
        while worker.status != Status.running:
            if worker.status in (Status.closing, Status.closed, Status.failed):
                return
            await asyncio.sleep(0.005)
        try:
            info = await worker.scheduler.pathways_controller()
            if not isinstance(info, dict) or "host_address" not in info:
                # Dask answers an operation it has no handler for with nothing at all.
                raise RuntimeError(
                    f"the Dask scheduler at {worker.scheduler.address} runs no pathways "
                    "controller: start it with `dask scheduler --preload "
                    "pathways_nb.deploy.scheduler`"
                )
            # Importing JAX, its start-up and the registration handshake take a while:
            # keep the worker's event loop free meanwhile.
            host = await loop.run_in_executor(None, start, info)
        except Exception:
            # A worker without its host serves nobody: closing it (and its nanny) ends
            # the `dask worker` command, so whoever started it sees the failure at once
            # instead of a cluster that never gets this host.
            log.exception("pathways host on %s %s", worker.address, HOST_FAILED)
            # The close runs this preload's teardown, which cancels a start still
            # running: this task is done starting, and must not cancel its own close.
            setattr(worker, _TASK_ATTR, None)
            await worker.close(reason="pathways-host-failed")
            return
        setattr(worker, _HOST_ATTR, host)
        log.info("pathways host %s serving %d devices", host.name, len(host.devices))

    setattr(worker, _TASK_ATTR, asyncio.ensure_future(start_when_running()))


async def dask_teardown(worker: Any) -> None:
    """Preload hook: stop the host."""
    task = getattr(worker, _TASK_ATTR, None)
    if task is not None and not task.done():
        task.cancel()
    host = getattr(worker, _HOST_ATTR, None)
    if host is not None:
        await asyncio.get_running_loop().run_in_executor(None, host.stop)
