"""The IFRT proxy's parts without a cluster: its messages, layouts, program signatures,
host buffers, and a server answering a real gRPC channel, malformed requests included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax._src.lib import _jax

from pathways_nb._core import DataLossError
from pathways_nb.proxy import ProxyServer
from pathways_nb.proxy._buffers import HostBuffers
from pathways_nb.proxy._layouts import (
    HLO_SHARDING,
    Layout,
    LayoutError,
    dtype_of,
    dtype_proto,
    layout_of,
    sharding_proto,
)
from pathways_nb.proxy._modules import ModuleError, read
from pathways_nb.proxy._protos import message
from pathways_nb.proxy._session import _from_bytes, _to_bytes
from pathways_nb.proxy._status import FAILED_PRECONDITION, NOT_FOUND, UNIMPLEMENTED


def _artifact(fn: Any, *args: Any, donate: tuple[int, ...] = ()) -> bytes:
    """What jaxlib's proxy client sends for ``jax.jit(fn)``: a StableHLO portable
    artifact of the lowered module."""
    lowered = jax.jit(fn, donate_argnums=donate).lower(*args)
    module = lowered.compiler_ir("stablehlo")
    code = mlir.module_to_bytecode(module)
    return bytes(_jax.mlir.serialize_portable_artifact(code, "1.0.0"))


def test_messages_come_from_the_installed_jaxlib() -> None:
    req = message("xla.ifrt.proxy.IfrtRequest")()
    assert "init_request" in req.DESCRIPTOR.fields_by_name
    assert "compile_request" in req.DESCRIPTOR.fields_by_name
    assert message("xla.ifrt.HloShardingProto").DESCRIPTOR.fields_by_name["xla_op_sharding"]


@pytest.mark.parametrize(
    "dtype",
    [
        np.bool_,
        np.int8,
        np.int32,
        np.int64,
        np.uint8,
        np.float16,
        np.float32,
        np.float64,
        ml_dtypes.bfloat16,
        np.complex64,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.int4,
    ],
)
def test_dtypes_go_both_ways(dtype: Any) -> None:
    assert dtype_of(dtype_proto(np.dtype(dtype))) == np.dtype(dtype)


def test_a_dtype_hosts_do_not_hold_says_what_they_do() -> None:
    proto = message("xla.ifrt.DTypeProto")(kind=message("xla.ifrt.DTypeProto").KIND_STRING)
    with pytest.raises(LayoutError, match=r"KIND_STRING.*booleans, integers"):
        dtype_of(proto)


def test_hlo_shardings_go_both_ways() -> None:
    op = message("xla.OpSharding")(type=3, tile_assignment_dimensions=[2, 1])
    op.iota_reshape_dims.append(2)
    op.iota_transpose_perm.append(0)
    layout = Layout((4, 5), op.SerializeToString())
    proto = sharding_proto(layout)
    assert proto.serialized_sharding.type_name == HLO_SHARDING
    assert layout_of(proto) == layout
    assert not layout.replicated
    assert Layout((4, 5)).replicated


def test_a_single_device_sharding_is_one_replicated_device() -> None:
    data = message("xla.ifrt.SingleDeviceShardingProto")(device_id=3).SerializeToString()
    proto = message("xla.ifrt.ShardingProto")()
    proto.serialized_sharding.type_name = "xla::ifrt::SingleDeviceSharding"
    proto.serialized_sharding.data = data
    assert layout_of(proto) == Layout((3,))


def test_an_unknown_sharding_type_names_the_ones_taken() -> None:
    proto = message("xla.ifrt.ShardingProto")()
    proto.serialized_sharding.type_name = "xla::ifrt::OpaqueSharding"
    with pytest.raises(LayoutError, match=r"OpaqueSharding.*HloSharding"):
        layout_of(proto)


def test_a_module_reads_as_its_signature_with_donations() -> None:
    x = jnp.ones((8, 4), jnp.float32)
    sig = read(_artifact(lambda a, b: (a * 2, b.sum()), x, x[0], donate=(0,)))
    assert sig.params == (((8, 4), np.dtype(np.float32)), ((4,), np.dtype(np.float32)))
    assert sig.results == (((8, 4), np.dtype(np.float32)), ((), np.dtype(np.float32)))
    assert sig.donated == (0,)
    assert sig.num_replicas == 1 and sig.num_partitions == 1


def test_bytes_that_are_no_module_are_refused() -> None:
    with pytest.raises(ModuleError, match="not a StableHLO portable artifact"):
        read(b"ML\xefR nonsense")


def test_strided_host_buffers_read_and_write() -> None:
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    fortran = np.asfortranarray(value)
    strides = list(fortran.strides)
    raw = _to_bytes(value, strides)
    assert raw == fortran.tobytes(order="A")
    np.testing.assert_array_equal(_from_bytes(raw, value.dtype, value.shape, strides), value)
    c = _to_bytes(value, None)
    np.testing.assert_array_equal(_from_bytes(c, value.dtype, value.shape, None), value)
    with pytest.raises(Exception, match="needs 48 bytes"):
        _from_bytes(c[:-4], value.dtype, value.shape, None)


def test_a_host_buffer_waited_for_arrives_from_another_thread() -> None:
    buffers = HostBuffers()
    threading.Timer(0.05, buffers.put, (7, b"abc")).start()
    assert buffers.take(7, timeout=30) == b"abc"
    with pytest.raises(TimeoutError, match="did not arrive"):
        buffers.take(8, timeout=0.01)
    buffers.close()
    with pytest.raises(LookupError, match="ended"):
        buffers.take(9, timeout=30)


def test_a_lookup_waits_for_a_copy_under_way_and_hears_why_it_failed() -> None:
    buffers = HostBuffers()
    assert buffers.get(1, timeout=30) is None  # nothing under way: not waited for
    buffers.expect(2)
    threading.Timer(0.05, buffers.put, (2, b"xyz")).start()
    assert buffers.get(2, timeout=30) == b"xyz"
    buffers.expect(3)
    threading.Timer(0.05, buffers.fail, (3, DataLossError("host h was lost"))).start()
    with pytest.raises(DataLossError, match="was lost"):
        buffers.get(3, timeout=30)
    buffers.expect(4)
    with pytest.raises(TimeoutError, match="not copied out"):
        buffers.get(4, timeout=0.01)
    threading.Timer(0.05, buffers.close).start()
    with pytest.raises(LookupError, match="ended"):
        buffers.get(4, timeout=30)


class _Backend:
    """Two devices and nothing else: what the session's requests see before any
    cluster work."""

    closed = False

    def describe(self, session_id: int, body: Any) -> None:
        body.session_id = session_id
        body.platform_name = "cpu"
        for i in range(2):
            d = body.all_devices.add()
            d.id = i
            d.default_memory_id = i
            d.memory_ids.append(i)
            m = body.memories.add()
            m.id = i
            m.memory_space_kind = "device"
            m.device_ids.append(i)
            body.primary_device_ids.append(i)
            body.addressable_device_ids.append(i)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def server() -> Iterator[ProxyServer]:
    s = ProxyServer(lambda init: _Backend())
    s.start()
    yield s
    s.stop()


def _channel(server: ProxyServer) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{server.port}")


def _call(channel: grpc.Channel, method: str, kind: str) -> Any:
    return getattr(channel, kind)(
        f"/xla.ifrt.proxy.GrpcIfrtService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )


def _session(server: ProxyServer, requests: list[Any]) -> list[Any]:
    with _channel(server) as ch:
        call = _call(ch, "IfrtSession", "stream_stream")
        cls = message("xla.ifrt.proxy.IfrtResponse")
        return [cls.FromString(b) for b in call(iter(requests))]


def _request(op: int, **kw: Any) -> Any:
    req = message("xla.ifrt.proxy.IfrtRequest")(**kw)
    req.request_metadata.op_id = op
    return req


def test_the_version_is_the_newest_both_speak(server: ProxyServer) -> None:
    req = message("xla.ifrt.proxy.GrpcGetVersionRequest")()
    req.min_version.protocol_version = 16
    req.max_version.protocol_version = 25
    req.max_version.ifrt_serdes_version_number = 3
    with _channel(server) as ch:
        raw = _call(ch, "GetVersion", "unary_unary")(req)
    got = message("xla.ifrt.proxy.GrpcGetVersionResponse").FromString(raw)
    assert (got.version.protocol_version, got.version.ifrt_serdes_version_number) == (25, 3)


def test_a_version_outside_the_proxys_is_refused_saying_why(server: ProxyServer) -> None:
    req = message("xla.ifrt.proxy.GrpcGetVersionRequest")()
    req.min_version.protocol_version = 40
    req.max_version.protocol_version = 50
    with _channel(server) as ch, pytest.raises(grpc.RpcError) as info:
        _call(ch, "GetVersion", "unary_unary")(req)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "16-25" in info.value.details()


def test_malformed_requests_get_error_statuses_and_the_session_goes_on(
    server: ProxyServer,
) -> None:
    init = message("xla.ifrt.proxy.InitRequest")()
    early = message("xla.ifrt.proxy.IsArrayDeletedRequest")(array_handle=5)
    unknown = message("xla.ifrt.proxy.IsArrayDeletedRequest")(array_handle=99)
    ready = message("xla.ifrt.proxy.CheckFutureRequest")(future_handle=1234)
    responses = _session(
        server,
        [
            _request(1, is_array_deleted_request=early),  # before init
            _request(2, init_request=init),
            _request(3),  # no request at all
            _request(4, is_array_deleted_request=unknown),
            _request(5, check_future_request=ready),
            _request(6, init_request=init),  # twice
        ],
    )
    by_op = {r.response_metadata.op_id: r for r in responses}
    assert sorted(by_op) == [1, 2, 3, 4, 5, 6]
    assert by_op[1].response_metadata.status.code == FAILED_PRECONDITION
    assert by_op[2].WhichOneof("response") == "init_response"
    assert len(by_op[2].init_response.all_devices) == 2
    assert by_op[3].response_metadata.status.code == UNIMPLEMENTED
    assert "not implemented" in by_op[3].response_metadata.status.message
    assert by_op[4].response_metadata.status.code == NOT_FOUND
    assert by_op[5].response_metadata.status.code == NOT_FOUND
    assert by_op[6].response_metadata.status.code == FAILED_PRECONDITION
    # Failed answers carry no body (the client reads a body as success).
    for op in (1, 3, 4, 5, 6):
        assert by_op[op].WhichOneof("response") is None
    assert server.sessions == 0


def test_host_buffer_rpcs_refuse_what_does_not_fit(server: ProxyServer) -> None:
    md = message("xla.ifrt.proxy.GrpcHostBufferStoreMetadata")(
        session_id=999, handle=1, buffer_size=3
    )
    chunk = message("xla.ifrt.proxy.GrpcHostBufferStoreRequest")(data=b"abc")
    with _channel(server) as ch:
        store = _call(ch, "HostBufferStore", "stream_unary")
        with pytest.raises(grpc.RpcError) as info:
            store(iter([chunk]), metadata=[(_STORE, md.SerializeToString())])
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            store(iter([chunk]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        lookup = _call(ch, "HostBufferLookup", "unary_stream")
        req = message("xla.ifrt.proxy.GrpcHostBufferLookupRequest")(session_id=999, handle=1)
        with pytest.raises(grpc.RpcError) as info:
            list(lookup(req))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_short_upload_is_data_loss_and_a_full_one_is_kept(server: ProxyServer) -> None:
    done = threading.Event()

    def requests() -> Iterator[Any]:
        yield _request(1, init_request=message("xla.ifrt.proxy.InitRequest")())
        done.wait(30)

    with _channel(server) as ch:
        stream = _call(ch, "IfrtSession", "stream_stream")(requests())
        first = message("xla.ifrt.proxy.IfrtResponse").FromString(next(stream))
        sid = first.init_response.session_id
        store = _call(ch, "HostBufferStore", "stream_unary")
        chunk = message("xla.ifrt.proxy.GrpcHostBufferStoreRequest")(data=b"abc")
        md = message("xla.ifrt.proxy.GrpcHostBufferStoreMetadata")
        short = md(session_id=sid, handle=1, buffer_size=10).SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            store(iter([chunk]), metadata=[(_STORE, short)])
        assert info.value.code() == grpc.StatusCode.DATA_LOSS
        assert "3 bytes arrived of 10" in info.value.details()
        whole = md(session_id=sid, handle=2, buffer_size=3).SerializeToString()
        store(iter([chunk, chunk.__class__(data=b"")]), metadata=[(_STORE, whole)])
        lookup = _call(ch, "HostBufferLookup", "unary_stream")
        req = message("xla.ifrt.proxy.GrpcHostBufferLookupRequest")(session_id=sid, handle=2)
        parts = [
            message("xla.ifrt.proxy.GrpcHostBufferLookupResponse").FromString(b)
            for b in lookup(req)
        ]
        assert b"".join(p.data for p in parts) == b"abc"
        done.set()
        assert list(stream) == []


_STORE = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"


def test_unreduced_devices_are_placed_as_replicas() -> None:
    from pathways_nb.proxy._layouts import summed

    cls = message("xla.OpSharding")
    # Split in 2 along dim 0, each half unreduced over 2 devices and replicated over 2.
    op = cls(type=cls.OTHER, tile_assignment_dimensions=[2, 2, 2])
    op.tile_assignment_devices.extend(range(8))
    op.last_tile_dims.extend([cls.UNREDUCED, cls.REPLICATED])
    out = cls.FromString(summed(op.SerializeToString()))
    assert list(out.tile_assignment_dimensions) == [2, 4]
    assert list(out.last_tile_dims) == [cls.REPLICATED]
    assert list(out.tile_assignment_devices) == list(range(8))
    assert summed(cls(type=cls.UNREDUCED).SerializeToString()) == b""
    plain = cls(type=cls.OTHER, tile_assignment_dimensions=[2])
    plain.tile_assignment_devices.extend([0, 1])
    assert summed(plain.SerializeToString()) == plain.SerializeToString()
