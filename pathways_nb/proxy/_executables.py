"""The executable requests of an IFRT session: compile, metadata, execute and the rest.

A program arrives as the StableHLO ``jax.jit`` lowered and the compile options it chose
over IFRT devices; the island's host compiles it (as ``jax.jit``'s first call compiles)
and reports its shardings, which the JAX client then lays its arrays out by.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from pathways_nb.proxy import _status
from pathways_nb.proxy._layouts import dtype_proto, shape_proto, sharding_proto
from pathways_nb.proxy._modules import ModuleError, read
from pathways_nb.proxy._protos import message
from pathways_nb.proxy._session import Session, register
from pathways_nb.proxy._status import ProxyError, unimplemented

XLA_PROGRAM = "xla::ifrt::XlaProgram"
XLA_COMPILE_OPTIONS = "xla::ifrt::XlaCompileOptions"


def _devices_of(options: Any) -> tuple[int, ...]:
    """The IFRT devices a compile's options name, replica-major as XLA numbers them."""
    build = options.executable_build_options
    da = build.device_assignment
    if not da.computation_devices:
        n = max(1, build.num_replicas) * max(1, build.num_partitions)
        if n != 1:
            raise ProxyError(
                _status.INVALID_ARGUMENT,
                f"a program for {n} devices came without a device assignment",
            )
        return (0,)
    replicas, computations = int(da.replica_count), int(da.computation_count)
    return tuple(
        int(da.computation_devices[c].replica_device_ids[r])
        for r in range(replicas)
        for c in range(computations)
    )


def _compile(s: Session, req: Any, body: Any) -> None:
    if req.program.type_name != XLA_PROGRAM:
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"program of type {req.program.type_name!r}; the pathways_nb proxy compiles "
            f"{XLA_PROGRAM} (what jax.jit sends)",
        )
    if req.compile_options.type_name != XLA_COMPILE_OPTIONS:
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"compile options of type {req.compile_options.type_name!r}; expected "
            f"{XLA_COMPILE_OPTIONS}",
        )
    if req.host_callbacks:
        raise ProxyError(
            _status.UNIMPLEMENTED,
            "the program calls back into Python on the host (jax.debug.print, "
            "jax.pure_callback, io_callback); programs run through pathways_nb cannot. "
            "Return the values and print them in the client",
        )
    xla_options = message("xla.ifrt.XlaCompileOptionsProto").FromString(req.compile_options.data)
    options = xla_options.compile_options
    try:
        signature = read(req.program.data)
    except ModuleError as exc:
        raise ProxyError(_status.INVALID_ARGUMENT, str(exc)) from None
    devices = _devices_of(options)
    exe = s.backend.compile(req.program.data, options.SerializeToString(), devices, signature)
    handle = s.new_handle()
    s.executables[handle] = exe
    body.loaded_executable_handle = handle
    body.name = signature.name
    body.num_devices = len(devices)
    body.device_ids.extend(devices)
    body.addressable_device_ids.extend(devices)
    # The client waits on this future before the first execute; the compile is done.
    body.ready_future_handle = s.done_future()
    fp = exe.info.get("fingerprint") or b""
    if fp:
        body.fingerprint_value = bytes(fp)


def _executable(s: Session, handle: int) -> Any:
    exe = s.executables.get(handle)
    if exe is None:
        raise ProxyError(_status.NOT_FOUND, f"unknown executable handle {handle}")
    return exe


def _metadata(s: Session, req: Any, body: Any) -> None:
    exe = _executable(s, req.loaded_executable_handle)
    info = exe.info
    op = message("xla.OpSharding")
    # A program of one device reports none: the client then keeps its own.
    if info["in_shardings"]:
        body.parameter_shardings.SetInParent()
        for data in info["in_shardings"]:
            body.parameter_shardings.shardings.append(op.FromString(bytes(data)))
    if info["out_shardings"]:
        body.output_shardings.SetInParent()
        for data in info["out_shardings"]:
            body.output_shardings.shardings.append(op.FromString(bytes(data)))
    for target, avals in (
        (body.parameter_layouts_list, exe.signature.params),
        (body.output_layouts_list, exe.signature.results),
    ):
        target.SetInParent()
        for shape, _ in avals:
            layout = target.layouts.add()
            layout.minor_to_major.extend(range(len(shape) - 1, -1, -1))
    kinds = body.output_memory_kinds.memory_kind_lists.add()
    kinds.memory_kinds.extend(["device"] * len(exe.signature.results))
    body.donated_input_indices.SetInParent()
    body.donated_input_indices.donated_input_indices.extend(exe.program.donate)
    memory = exe.analysis.get("memory")
    if memory:
        stats = body.compiled_memory_stats
        for name, value in memory.items():
            if name in stats.DESCRIPTOR.fields_by_name:
                setattr(stats, name, int(value))
    body.size_of_generated_code_in_bytes = int(info.get("code_bytes") or 0)


def _execute(s: Session, req: Any, body: Any) -> Any:
    exe = _executable(s, req.loaded_executable_handle)
    given = list(req.result_array_handle)
    n = len(exe.signature.results)
    handles = given if given else [s.new_handle() for _ in range(n)]
    if len(handles) != n:
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"{exe.program.name} makes {n} outputs; the request names {len(handles)} handles",
        )
    fill_status = bool(req.execute_options.fill_status)
    if req.result_status_handle and not fill_status:
        raise ProxyError(
            _status.INVALID_ARGUMENT, "a result status handle was given without fill_status"
        )
    if len(req.args_handles) != len(exe.signature.params):
        raise ProxyError(
            _status.INVALID_ARGUMENT,
            f"{exe.program.name} takes {len(exe.signature.params)} arguments; got "
            f"{len(req.args_handles)}",
        )
    given_args = [s.entry(h) for h in req.args_handles]
    # A donated array another entry holds too (a view, a copy on the same layout) is
    # copied first: the donation takes the copy's buffer only.
    args = [
        s.backend.copy(a) if i in exe.program.donate and s.shared(a) else a
        for i, a in enumerate(given_args)
    ]
    outs = s.backend.launch(exe, args)
    for i in exe.program.donate:
        s.drop(given_args[i])
    for h, e in zip(handles, outs, strict=True):
        s.store(h, e)
    if not given:
        for h, e in zip(handles, outs, strict=True):
            o = body.outputs.add()
            o.dtype.CopyFrom(dtype_proto(e.dtype))
            o.shape.CopyFrom(shape_proto(e.shape))
            o.sharding.CopyFrom(sharding_proto(e.layout))
            o.array_handle = h
    if fill_status:
        status = req.result_status_handle or s.new_handle()
        s.futures[status] = s.later(lambda: s.backend.wait(outs))
        body.status_handle = status
    return None


def _fetch_execute_result(s: Session, req: Any, body: Any) -> concurrent.futures.Future[None]:
    fut = s.futures.pop(req.result_status_handle, None)
    if fut is None:
        raise ProxyError(
            _status.NOT_FOUND, f"unknown execute status handle {req.result_status_handle}"
        )
    return fut


def _cost_analysis(s: Session, req: Any, body: Any) -> None:
    exe = _executable(s, req.loaded_executable_handle)
    cost = exe.analysis.get("cost") or {}
    for name, value in cost.items():
        body.attributes.attributes[str(name)].float_value = float(value)
    body.attributes.SetInParent()


def _program_text(s: Session, req: Any, body: Any) -> None:
    exe = _executable(s, req.loaded_executable_handle)
    body.human_readable_program_text = exe.analysis.get("hlo") or ""


def _delete(s: Session, req: Any, body: Any) -> None:
    exe = _executable(s, req.loaded_executable_handle)
    exe.deleted = True
    body.future_handle = s.done_future()


def _is_deleted(s: Session, req: Any, body: Any) -> None:
    body.is_deleted = _executable(s, req.loaded_executable_handle).deleted


def _destruct(s: Session, req: Any, body: Any) -> None:
    if s.executables.pop(req.loaded_executable_handle, None) is None:
        raise ProxyError(
            _status.NOT_FOUND, f"unknown executable handle {req.loaded_executable_handle}"
        )


def _not_mpmd(s: Session, req: Any, body: Any) -> None:
    raise unimplemented("MPMD executables (one program over several islands)")


for _name, _fn in {
    "compile_request": _compile,
    "loaded_executable_metadata_request": _metadata,
    "loaded_executable_execute_request": _execute,
    "loaded_executable_fetch_execute_result_request": _fetch_execute_result,
    "loaded_executable_cost_analysis_request": _cost_analysis,
    "loaded_executable_human_readable_program_text_request": _program_text,
    "loaded_executable_delete_request": _delete,
    "loaded_executable_is_deleted_request": _is_deleted,
    "loaded_executable_destruct_request": _destruct,
    "loaded_executable_mpmd_metadata_request": _not_mpmd,
    "loaded_executable_mpmd_cost_analysis_request": _not_mpmd,
}.items():
    register(_name, _fn)
