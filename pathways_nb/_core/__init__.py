"""Shared by every role: ids, mesh and sharding specs, config, errors, versions, the
machine's memory.

This package imports nothing else from ``pathways_nb``.
"""

from pathways_nb._core._colocated import PAYLOAD_VERSION, Payload, Slot, fill, is_slot
from pathways_nb._core._config import PROFILE_MAX_SECONDS, Config, default_config
from pathways_nb._core._dtypes import as_bytes, decode_dtype, encode_dtype
from pathways_nb._core._errors import (
    CHECK_INFS,
    CHECK_NANS,
    BrokenError,
    BusyError,
    CancelledError,
    ClosedError,
    DataLossError,
    NonFiniteError,
    PathwaysError,
    ProtocolError,
    RemoteError,
    ResourceExhaustedError,
    VersionMismatchError,
)
from pathways_nb._core._hlo import HloBlob, hlo_blob, op_sharding
from pathways_nb._core._ids import (
    AXIS_TYPES,
    PROGRAM_KINDS,
    HandleAllocator,
    axis_type_names,
    compiler_options,
    describe_foreign,
    donated_twice,
    foreign,
    handle_owner,
    program_id,
)
from pathways_nb._core._keys import host_token, new_secret, tenant_token, token_matches
from pathways_nb._core._memory import (
    CHECK_FROM,
    Memory,
    check_fits,
    machine_memory,
    on_this_machine,
)
from pathways_nb._core._specs import (
    decode_mesh,
    decode_spec,
    encode_mesh,
    encode_spec,
    entry_axes,
    shard_indices,
    validate_mesh_shape,
    validate_weight,
)
from pathways_nb._core._tls import NO_TLS, TLS_PREFIX, TLSContexts, check_security, missing_tls
from pathways_nb._core._versions import Versions, local_versions

__all__ = [
    "AXIS_TYPES",
    "CHECK_FROM",
    "CHECK_INFS",
    "CHECK_NANS",
    "NO_TLS",
    "PAYLOAD_VERSION",
    "PROFILE_MAX_SECONDS",
    "PROGRAM_KINDS",
    "TLS_PREFIX",
    "BrokenError",
    "BusyError",
    "CancelledError",
    "ClosedError",
    "Config",
    "DataLossError",
    "HandleAllocator",
    "HloBlob",
    "Memory",
    "NonFiniteError",
    "PathwaysError",
    "Payload",
    "ProtocolError",
    "RemoteError",
    "ResourceExhaustedError",
    "Slot",
    "TLSContexts",
    "VersionMismatchError",
    "Versions",
    "as_bytes",
    "axis_type_names",
    "check_fits",
    "check_security",
    "compiler_options",
    "decode_dtype",
    "decode_mesh",
    "decode_spec",
    "default_config",
    "describe_foreign",
    "donated_twice",
    "encode_dtype",
    "encode_mesh",
    "encode_spec",
    "entry_axes",
    "fill",
    "foreign",
    "handle_owner",
    "hlo_blob",
    "host_token",
    "is_slot",
    "local_versions",
    "machine_memory",
    "missing_tls",
    "new_secret",
    "on_this_machine",
    "op_sharding",
    "program_id",
    "shard_indices",
    "tenant_token",
    "token_matches",
    "validate_mesh_shape",
    "validate_weight",
]
