"""The IFRT proxy's protocol buffers, read from the jaxlib this process imports.

jaxlib's shared library carries the serialized descriptor of every ``.proto`` file it was
built from, as any C++ protobuf program does. Reading them from there gives messages that
match the installed client field for field, with nothing generated or copied into this
package, and moves with jaxlib when it is upgraded.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

# The files whose messages the proxy speaks; their imports come along.
ROOTS = (
    "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto",
    "xla/python/pjrt_ifrt/xla_compiler.proto",
    "xla/python/pjrt_ifrt/xla_sharding.proto",
    "xla/python/ifrt/sharding_serdes.proto",
    "xla/xla.proto",
)
# Files protobuf's own runtime defines: taken from it, not from the library.
_WELL_KNOWN = {"google/protobuf/any.proto": any_pb2}

_lock = threading.Lock()


class ProtoError(RuntimeError):
    """The installed jaxlib does not carry the descriptors the proxy needs."""


def _library() -> str:
    import jaxlib

    folder = os.path.dirname(jaxlib.__file__)
    for name in ("libjax_common.so", "_jax.so", "xla_extension.so"):
        path = os.path.join(folder, name)
        if os.path.exists(path) and os.path.getsize(path) > 1 << 20:
            return path
    raise ProtoError(
        f"no jaxlib shared library with protocol descriptors under {folder}; the proxy "
        "needs a jaxlib wheel (0.10.x) installed in this environment"
    )


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _extent(buf: bytes, start: int) -> int:
    """The end of the FileDescriptorProto at ``start``: its fields run until bytes that
    cannot be one of its fields (numbers 1 to 15, varints or length-delimited)."""
    i = end = start
    n = len(buf)
    while i < n:
        tag, j = _varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if not 1 <= field <= 15 or wire not in (0, 2):
            break
        if wire == 0:
            _, j = _varint(buf, j)
        else:
            length, j = _varint(buf, j)
            j += length
            if j > n:
                break
        i = end = j
    return end


def _descriptor(data: bytes, name: str) -> descriptor_pb2.FileDescriptorProto:
    encoded = name.encode()
    needle = b"\x0a" + bytes([len(encoded)]) + encoded
    at = data.find(needle)
    while at >= 0:
        fd = descriptor_pb2.FileDescriptorProto()
        try:
            fd.ParseFromString(data[at : _extent(data, at)])
        except Exception:  # a string that only looks like the start of one
            fd = None
        if fd is not None and fd.name == name and (fd.message_type or fd.enum_type):
            return fd
        at = data.find(needle, at + 1)
    raise ProtoError(f"jaxlib's library carries no descriptor of {name}")


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """A descriptor pool holding :data:`ROOTS` and what they import."""
    with _lock:
        with open(_library(), "rb") as f:
            data = f.read()
        out = descriptor_pool.DescriptorPool()
        added: set[str] = set()

        def add(name: str) -> None:
            if name in added:
                return
            if name in _WELL_KNOWN:
                fd = descriptor_pb2.FileDescriptorProto()
                _WELL_KNOWN[name].DESCRIPTOR.CopyToProto(fd)
            else:
                fd = _descriptor(data, name)
                for dep in fd.dependency:
                    add(dep)
            out.Add(fd)
            added.add(name)

        for root in ROOTS:
            add(root)
        return out


_classes: dict[str, Any] = {}


def message(full_name: str) -> Any:
    """The message class of ``full_name`` (``"xla.ifrt.proxy.IfrtRequest"``)."""
    cls = _classes.get(full_name)
    if cls is None:
        descriptor = pool().FindMessageTypeByName(full_name)
        # Classes are made under one lock: protobuf's runtime does not make two at once
        # safely, and gRPC's threads each ask for theirs.
        with _lock:
            cls = _classes.get(full_name)
            if cls is None:
                cls = _classes[full_name] = message_factory.GetMessageClass(descriptor)
    return cls


def preload() -> None:
    """Make every message class of :data:`ROOTS` and their imports now, before any
    thread of a server asks for one."""
    p = pool()
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        fd = p.FindFileByName(name)
        for dep in fd.dependencies:
            visit(dep.name)
        for m in fd.message_types_by_name.values():
            message(m.full_name)

    for root in ROOTS:
        visit(root)
