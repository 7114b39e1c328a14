"""Where stream endpoints listen and how peers reach them: ``tcp://HOST:PORT``, or
``ipc://NAME`` (``ipc://@name`` for Linux's abstract Unix sockets)."""

from __future__ import annotations

import itertools
import os
import socket
import sys


def parse_tcp(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` → ``(HOST, PORT)``."""
    if not address.startswith("tcp://") or ":" not in address[6:]:
        raise ValueError(f"expected an address like tcp://127.0.0.1:5555; got {address!r}")
    host, _, port = address[6:].rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_local_names = itertools.count()


def listen(address: str) -> tuple[socket.socket, str]:
    """A listening socket for ``tcp://HOST:PORT`` and the address peers dial.

    An endpoint bound to loopback is reachable from this machine only, so on Linux it
    listens on an abstract Unix socket instead (``ipc://@name``): the same reach, without
    the TCP stack, which roughly halves the CPU a small message costs each side.
    """
    if address.startswith("ipc://"):
        name = address[len("ipc://") :]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(name.replace("@", "\0", 1) if name.startswith("@") else name)
        sock.listen(128)
        return sock, address
    host, port = parse_tcp(address)
    if host in _LOOPBACK and port == 0 and sys.platform == "linux":
        return listen(f"ipc://@pathways-{os.getpid()}-{next(_local_names)}")
    sock = socket.create_server((host, port), backlog=128)
    return sock, format_tcp(host, sock.getsockname()[1])


def dial(address: str, timeout: float) -> socket.socket:
    """A connected socket to a stream endpoint's address (``tcp://`` or ``ipc://``)."""
    if address.startswith("ipc://"):
        name = address[len("ipc://") :]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(name.replace("@", "\0", 1) if name.startswith("@") else name)
        return sock
    return socket.create_connection(parse_tcp(address), timeout=timeout)


def format_tcp(host: str, port: int) -> str:
    """``(HOST, PORT)`` → ``tcp://HOST:PORT`` (an IPv6 host in brackets)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
