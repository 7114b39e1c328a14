"""The gRPC server JAX's IFRT proxy client talks to (``JAX_PLATFORMS=proxy``).

jaxlib's client speaks ``xla.ifrt.proxy.GrpcIfrtService``: a version handshake, one
bidirectional stream per session, and host-buffer streams for array bytes. Every answer
must be well formed (the client aborts its process on some malformed ones), so each
request's failure becomes an error status, and nothing a client sends stops the server.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from pathways_nb.proxy import (
    _executables,  # noqa: F401  (registers its handlers)
    _remap,  # noqa: F401  (registers its handler)
    _status,
)
from pathways_nb.proxy._protos import message, preload
from pathways_nb.proxy._session import HOST_BUFFER_WAIT, Session

log = logging.getLogger("pathways_nb.proxy")

SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
# The protocol and serialization versions this server speaks: those of jaxlib 0.10.
PROTOCOL_VERSIONS = (16, 25)
SERDES_VERSIONS = (0, 3)
CHUNK = 1 << 20

# Makes the backend of a new session from its initialization data (a dict).
BackendFactory = Callable[[dict[str, Any]], Any]


class ProxyServer:
    """Serves IFRT proxy sessions, each on a backend ``factory`` makes; ``start`` binds
    ``address`` (``127.0.0.1:PORT``; port 0 picks one) and returns the port."""

    def __init__(self, factory: BackendFactory, address: str = "127.0.0.1:0") -> None:
        self.factory = factory
        self.address = address
        self.port = 0
        self._sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> int:
        if self._server is not None:
            return self.port
        preload()
        server = grpc.server(
            futures.ThreadPoolExecutor(32, thread_name_prefix="pw-proxy-grpc"),
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
            ],
        )
        server.add_generic_rpc_handlers((self._handlers(),))
        port = server.add_insecure_port(self.address)
        if port == 0:
            raise OSError(f"the proxy could not listen on {self.address}")
        server.start()
        self._server, self.port = server, port
        return port

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and end every session; safe twice."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.close()

    def wait(self) -> None:
        if self._server is not None:
            self._server.wait_for_termination()

    @property
    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- RPCs -------------------------------------------------------------------------
    def _handlers(self) -> grpc.GenericRpcHandler:
        m = message

        def ser(x: Any) -> bytes:
            return bytes(x.SerializeToString())

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetVersion": grpc.unary_unary_rpc_method_handler(
                    self._get_version, m("xla.ifrt.proxy.GrpcGetVersionRequest").FromString, ser
                ),
                "IfrtSession": grpc.stream_stream_rpc_method_handler(
                    self._session, m("xla.ifrt.proxy.IfrtRequest").FromString, ser
                ),
                "HostBufferStore": grpc.stream_unary_rpc_method_handler(
                    self._store, m("xla.ifrt.proxy.GrpcHostBufferStoreRequest").FromString, ser
                ),
                "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
                    self._lookup, m("xla.ifrt.proxy.GrpcHostBufferLookupRequest").FromString, ser
                ),
                "HostBufferDelete": grpc.unary_unary_rpc_method_handler(
                    self._delete, m("xla.ifrt.proxy.GrpcHostBufferDeleteRequest").FromString, ser
                ),
            },
        )

    def _get_version(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        lo, hi = req.min_version.protocol_version, req.max_version.protocol_version
        slo, shi = (
            req.min_version.ifrt_serdes_version_number,
            req.max_version.ifrt_serdes_version_number,
        )
        protocol = min(hi, PROTOCOL_VERSIONS[1])
        serdes = min(shi, SERDES_VERSIONS[1])
        if protocol < max(lo, PROTOCOL_VERSIONS[0]) or serdes < max(slo, SERDES_VERSIONS[0]):
            ctx.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this pathways_nb proxy speaks IFRT proxy protocol versions "
                f"{PROTOCOL_VERSIONS[0]}-{PROTOCOL_VERSIONS[1]} and serialization versions "
                f"{SERDES_VERSIONS[0]}-{SERDES_VERSIONS[1]} (jaxlib 0.10); the client asked for "
                f"{lo}-{hi} and {slo}-{shi}: use the jaxlib pathways_nb is installed with",
            )
        resp = message("xla.ifrt.proxy.GrpcGetVersionResponse")()
        resp.version.protocol_version = protocol
        resp.version.ifrt_serdes_version_number = serdes
        return resp

    def _session(self, requests: Iterator[Any], ctx: grpc.ServicerContext) -> Iterator[Any]:
        sid = next(self._ids)
        session = Session(sid, self.factory, _initialization_data(ctx))
        with self._lock:
            self._sessions[sid] = session
        out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._read, args=(session, requests, out), name=f"pw-proxy-session-{sid}"
        )
        reader.start()
        seq = 0
        try:
            while True:
                resp = out.get()
                if resp is None:
                    break
                if not resp.response_metadata.status.code:
                    resp.response_metadata.seq_num = seq
                    seq += 1
                yield resp
        finally:
            with self._lock:
                self._sessions.pop(sid, None)
            session.close()

    def _read(self, session: Session, requests: Iterator[Any], out: queue.SimpleQueue[Any]) -> None:
        """The session's requests, handled in order; answers go to ``out`` as they are
        ready (None once the client has gone)."""
        try:
            for req in requests:
                resp = session.handle(req)
                if isinstance(resp, futures.Future):
                    resp.add_done_callback(lambda f: out.put(f.result()))
                else:
                    out.put(resp)
        except grpc.RpcError:
            pass  # the client cancelled its stream: the usual end of a JAX process
        except Exception as exc:
            log.warning("proxy session %d ended: %s", session.id, exc)
        finally:
            out.put(None)

    def _find(self, session_id: int, ctx: grpc.ServicerContext) -> Session:
        with self._lock:
            s = self._sessions.get(int(session_id))
        if s is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"no proxy session {session_id}")
        return s  # type: ignore[return-value]

    def _store(self, chunks: Iterator[Any], ctx: grpc.ServicerContext) -> Any:
        raw = dict(ctx.invocation_metadata()).get(STORE_METADATA)
        if not isinstance(raw, bytes):
            ctx.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"a host buffer store needs {STORE_METADATA}"
            )
        md = message("xla.ifrt.proxy.GrpcHostBufferStoreMetadata").FromString(raw)
        session = self._find(md.session_id, ctx)
        parts = [c.data for c in chunks]
        data = b"".join(parts)
        if len(data) != md.buffer_size:
            ctx.abort(
                grpc.StatusCode.DATA_LOSS,
                f"host buffer {md.handle}: {len(data)} bytes arrived of {md.buffer_size}",
            )
        session.buffers.put(int(md.handle), data)
        return message("xla.ifrt.proxy.GrpcHostBufferStoreResponse")()

    def _lookup(self, req: Any, ctx: grpc.ServicerContext) -> Iterator[Any]:
        session = self._find(req.session_id, ctx)
        try:
            # A copy out is answered before its bytes are here: they are waited for.
            data = session.buffers.get(int(req.handle), HOST_BUFFER_WAIT)
        except Exception as exc:
            ctx.abort(_status.grpc_code(exc), _status.message_of(exc))
        if data is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"no host buffer {req.handle}")
        cls = message("xla.ifrt.proxy.GrpcHostBufferLookupResponse")
        view = memoryview(data)  # type: ignore[arg-type]
        yield cls(data=bytes(view[:CHUNK]))
        for at in range(CHUNK, len(view), CHUNK):
            yield cls(data=bytes(view[at : at + CHUNK]))

    def _delete(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        session = self._find(req.session_id, ctx)
        session.buffers.delete(int(req.handle))
        return message("xla.ifrt.proxy.GrpcHostBufferDeleteResponse")()


def _initialization_data(ctx: grpc.ServicerContext) -> dict[str, Any]:
    """The session metadata's initialization data, as plain values."""
    raw = dict(ctx.invocation_metadata()).get(SESSION_METADATA)
    if not isinstance(raw, bytes):
        return {}
    try:
        md = message("xla.ifrt.proxy.GrpcIfrtSessionMetadata").FromString(raw)
    except Exception:
        return {}
    out: dict[str, Any] = {}
    for key, value in md.initialization_data.attributes.items():
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[key] = value.string_value.decode(errors="replace")
        elif kind == "int64_list_value":
            out[key] = list(value.int64_list_value.elements)
        elif kind is not None:
            out[key] = getattr(value, kind)
    return out
