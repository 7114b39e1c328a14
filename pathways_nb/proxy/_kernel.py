"""``pw.use_jax(client)``: this process's plain JAX runs on the client's cluster.

The proxy runs in a process of its own beside this one: jaxlib's client waits on the
proxy holding the GIL, and a proxy on a thread of the same process would then wait for
it. JAX's CPU backend stays, for ``pw.jit``'s tracing and the arrays this process
already holds; the proxy backend becomes the default, so ``jax.devices()``,
``jax.device_put`` and ``jax.jit`` go to the cluster.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
from typing import Any

from pathways_nb._core import validate_weight

_TARGET = re.compile(r"JAX_BACKEND_TARGET=(grpc://\S+)")


class ProxyProcess:
    """A ``pathways-nb proxy`` process serving this process's JAX; ``stop`` ends it
    (also at exit, and when this process dies, it ends itself)."""

    def __init__(
        self, address: str, name: str = "", weight: float = 1.0, security: Any = None
    ) -> None:
        env = dict(os.environ)
        # What pathways_nb.deploy._watch reads: the proxy ends with this process.
        env["PATHWAYS_PARENT_PID"] = str(os.getpid())
        # The proxy runs no program itself: it only reads them.
        env["JAX_PLATFORMS"] = "cpu"
        command = [
            sys.executable,
            "-m",
            "pathways_nb.deploy._cli",
            "proxy",
            *self._where(address, security),
            "--port",
            "0",
            "--weight",
            repr(float(weight)),
        ]
        if name:
            command += ["--name", name]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.target = self._wait_target(60.0)
        atexit.register(self.stop)

    def _where(self, address: str, security: Any) -> list[str]:
        """The proxy's way to the cluster: its address, or, for a cluster with TLS, a
        scheduler file naming the client certificate's files, in a folder of this
        user's only (removed when the proxy stops)."""
        self._folder: str | None = None
        tls = security is not None and security.get_connection_args("client").get("ssl_context")
        if not tls:
            return [address]
        import json
        import tempfile

        self._folder = tempfile.mkdtemp(prefix="pathways-proxy-")  # mode 0700
        files = {}
        for key in ("tls_ca_file", "tls_client_cert", "tls_client_key"):
            value = str(getattr(security, key, "") or "")
            if "-----BEGIN" in value:  # PEM text held in memory: a file of it, here
                files[key] = os.path.join(self._folder, key + ".pem")
                fd = os.open(files[key], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(value)
            elif value:
                files[key] = value
        path = os.path.join(self._folder, "cluster.json")
        with open(path, "w") as f:
            json.dump({"address": address, "tls": files}, f)
        return ["--scheduler-file", path]

    def _wait_target(self, timeout: float) -> str:
        assert self.process.stdout is not None
        lines: list[str] = []
        found: list[str] = []

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                lines.append(line)
                m = _TARGET.search(line)
                if m:
                    found.append(m.group(1))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            self.stop()
            err = self.process.stderr.read() if self.process.stderr else ""
            raise RuntimeError(
                "the pathways_nb proxy did not start: " + ("".join(lines) + err).strip()[-2000:]
            )
        return found[0]

    def stop(self) -> None:
        """End the proxy; safe twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._folder is not None:
            import shutil

            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


_STATE: dict[str, Any] = {}


def use_jax(client: Any, *, name: str | None = None, weight: float | None = None) -> Any:
    """Run this process's plain JAX on ``client``'s cluster, through an IFRT proxy.

    ``jax.devices()`` becomes the cluster's devices (one slice per island; a device's
    ``slice_index`` is its island), and ``jax.device_put``, ``jax.jit`` and everything
    built on them (Flax, Optax) run there, as a tenant named ``name`` (default: the
    client's name and ``-jax``) with ``weight``. Returns the proxy's
    :class:`ProxyProcess`. JAX's CPU backend stays, with the arrays it holds::

        pw.use_jax(client)
        x = jax.device_put(np.ones(8))      # on the cluster
    """
    from jax._src import xla_bridge
    from jax.extend.backend import ifrt_proxy

    if "proxy" in _STATE:
        proxy: ProxyProcess = _STATE["proxy"]
        if proxy.process.poll() is None:
            return proxy
        stop_jax()  # its proxy ended (its cluster stopped): a new one
    address = getattr(client, "scheduler_address", None)
    if not address:
        raise ValueError(
            "pw.use_jax needs a client of a cluster reached through a Dask scheduler "
            "(pw.LocalCluster, `pathways-nb cluster`, an address); an in-process cluster "
            "has no address another process can reach"
        )
    tenant = name if name is not None else f"{getattr(client, 'name', '') or 'notebook'}-jax"
    proxy = ProxyProcess(
        address,
        tenant,
        validate_weight(1.0 if weight is None else weight),
        getattr(client, "security", None),
    )
    os.environ.setdefault("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true")
    options = ifrt_proxy.ClientConnectionOptions()
    options.connection_timeout_in_seconds = 60
    backend = ifrt_proxy.get_client(proxy.target, options)
    xla_bridge.backends()  # the local backends, if they have not started yet
    with xla_bridge._backend_lock:
        xla_bridge._backends["proxy"] = backend
        xla_bridge._default_backend = backend
    xla_bridge.get_backend.cache_clear()
    import jax

    jax.clear_caches()  # compiled for the CPU default backend until now
    _STATE["proxy"] = proxy
    _STATE["backend"] = backend
    return proxy


def stop_jax() -> bool:
    """Undo :func:`use_jax`: JAX's default backend is this process's own again, and the
    proxy ends (its session's arrays with it). Arrays made on the cluster cannot be
    used afterwards. False if JAX was not on a cluster."""
    import gc

    import jax
    from jax._src import xla_bridge

    proxy = _STATE.pop("proxy", None)
    backend = _STATE.pop("backend", None)
    if proxy is None:
        return False
    with xla_bridge._backend_lock:
        xla_bridge._backends.pop("proxy", None)
        local = xla_bridge._backends.get("cpu") or next(iter(xla_bridge._backends.values()), None)
        xla_bridge._default_backend = local
    xla_bridge.get_backend.cache_clear()
    # The compiled programs and the client go while the proxy still answers them.
    jax.clear_caches()
    del backend
    gc.collect()
    proxy.stop()
    return True
