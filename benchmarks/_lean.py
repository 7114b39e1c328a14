"""A lean reference path for the chained calls: a client, a controller and a host in
three processes over ZeroMQ, with nothing but the messages and the calls.

The client sends one message per call; the controller decodes it, stamps an order and
forwards it; the host runs the compiled program on its arrays, keeps the output, drops
the input, and answers only the calls the client waits on. No futures, gang scheduler,
window, acknowledgements, event log or error handling: what three Python processes
cost per call on this machine before a runtime adds any of those, measured beside
pathways_nb and plain JAX in one run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

import msgpack
import psutil
import zmq

from benchmarks._common import WAIT_EVERY


def _host(program: Callable[[Any], Any], size: int, port_q: Any) -> None:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    sh = NamedSharding(mesh, P("d"))
    spec = jax.ShapeDtypeStruct((size,), np.float32, sharding=sh)
    fn = jax.jit(program, out_shardings=sh).lower(spec).compile()
    store = {0: jax.device_put(np.ones(size, np.float32), sh)}
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    port_q.put(sock.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        m = msgpack.unpackb(sock.recv())
        if m["t"] == "stop":
            return
        out = store[m["out"]] = fn(store[m["in"]])
        if m.get("drop"):
            store.pop(m["drop"], None)
        if m.get("wait"):
            out.block_until_ready()
            sock.send(msgpack.packb({"t": "done", "lid": m["lid"]}))


def _controller(host_port: int, port_q: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    clients = ctx.socket(zmq.ROUTER)
    port_q.put(clients.bind_to_random_port("tcp://127.0.0.1"))
    host = ctx.socket(zmq.DEALER)
    host.connect(f"tcp://127.0.0.1:{host_port}")
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(host, zmq.POLLIN)
    client, order = b"", 0
    while True:
        for sock, _ in poller.poll():
            if sock is clients:
                client, raw = clients.recv_multipart()
                m = msgpack.unpackb(raw)
                order += 1
                m["order"] = order
                host.send(msgpack.packb(m))
                if m["t"] == "stop":
                    return
            else:
                clients.send_multipart([client, host.recv()])


class LeanPath:
    """The three processes; :meth:`chain` times ``calls`` chained calls of ``program``
    (a module-level function, so the host imports it) on a float32 array of ``size``
    elements sharded over 4 devices."""

    def __init__(self, program: Callable[[Any], Any], size: int) -> None:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        self._host = ctx.Process(target=_host, args=(program, size, q), daemon=True)
        self._host.start()
        host_port = q.get(timeout=120)
        self._ctl = ctx.Process(target=_controller, args=(host_port, q), daemon=True)
        self._ctl.start()
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.connect(f"tcp://127.0.0.1:{q.get(timeout=60)}")
        self.procs = {
            "client": psutil.Process(),
            "controller": psutil.Process(self._ctl.pid),
            "host": psutil.Process(self._host.pid),
        }
        self._next = 1
        self.chain(300)  # connections, XLA's threads, allocator

    def chain(self, calls: int) -> float:
        """Seconds for ``calls`` dependent calls, waiting on every ``WAIT_EVERY``-th."""
        t0 = time.perf_counter()
        x = 0
        for i in range(calls):
            y, self._next = self._next, self._next + 1
            m: dict[str, Any] = {"t": "run", "lid": y, "in": x, "out": y, "pid": "p1"}
            if x:
                m["drop"] = x
            wait = i % WAIT_EVERY == WAIT_EVERY - 1 or i == calls - 1
            if wait:
                m["wait"] = 1
            self._sock.send(msgpack.packb(m))
            if wait:
                self._sock.recv()
            x = y
        return time.perf_counter() - t0

    def close(self) -> None:
        self._sock.send(msgpack.packb({"t": "stop"}))
        for p in (self._ctl, self._host):
            p.join(10)
            if p.is_alive():
                p.kill()
        self._sock.close(0)
