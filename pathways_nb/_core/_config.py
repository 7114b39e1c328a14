"""Tunables, read once from the environment, overridable per object."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

# The longest a profile of the hosts (client.profile) may run: a trace of every op on
# every device grows without end. Clients refuse a longer limit; hosts clamp to it.
PROFILE_MAX_SECONDS = 3600.0

# The smallest message limit (max_control_message, max_data_message) accepted, in bytes.
MIN_MESSAGE_LIMIT = 1024


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {raw!r}") from None


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be a number; got {raw!r}") from None


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = {"1": True, "true": True, "0": False, "false": False}.get(raw.strip().lower())
    if value is None:
        raise ValueError(
            f"environment variable {name} must be 1 or 0 (true/false); got {raw!r}"
        ) from None
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """Runtime limits. Every field can be set by the ``PATHWAYS_<FIELD>`` variable."""

    # Launches the gang scheduler lets run at once per XLA process. XLA's CPU rendezvous
    # deadlocks with ~128 queued collective programs; 8-32 in flight is safe and fastest.
    inflight_window: int = 16
    # Launches one client may have queued before submission blocks (back-pressure).
    max_queued_per_client: int = 10_000
    # Events the controller keeps (a ring buffer, so memory is bounded).
    event_log_size: int = 200_000
    # Largest control message accepted by the controller, in bytes.
    max_control_message: int = 256 * 2**20
    # Largest data message accepted by a host, in bytes.
    max_data_message: int = 16 * 2**30
    # Object store limit per host in bytes (0: no limit beyond the devices' own memory).
    store_limit_bytes: int = 0
    # Seconds a client may stay silent before its lease lapses and its slices are freed.
    lease_seconds: float = 30.0
    # Seconds a host may stay silent (it beats every second) before the controller
    # declares it lost, for hosts whose death the cluster engine does not report.
    host_timeout_seconds: float = 30.0
    # Seconds a host waits for an array the client put but that has not arrived yet.
    put_wait_seconds: float = 60.0
    # Compiled executables a host keeps, least recently used dropped beyond it (~0.2 MB
    # each for a small program on CPU): a notebook tracing a new function per cell or per
    # sweep value would otherwise grow the host without end. A dropped one compiles again
    # when used (from the persistent compilation cache).
    host_executables: int = 256
    # Nice value a host gives XLA's own threads when its devices are CPU devices, so
    # the control plane's Python threads run first when both want a core (XLA's threads
    # spin for work before they sleep); 0 leaves them at the process's priority.
    cpu_device_nice: int = 19
    # Whether those threads also run under Linux's SCHED_IDLE policy: a core running
    # only them counts as idle where the kernel places a thread it wakes, so a woken
    # Python thread takes it at once instead of queuing behind a busy one.
    cpu_device_idle: bool = True
    # Whether those threads are also pinned round-robin to the process's cores (needed
    # at a nice value alone, where the kernel packed them on one core).
    cpu_device_spread: bool = False
    # Whether a slice lost with its host moves onto free devices as soon as there are
    # any (another island's, a host that joins, the restarted one first, or devices a
    # release frees), as the same VirtualSlice; its arrays stay lost.
    remap_lost_slices: bool = True
    # Seconds a client's new work for a lost slice (a put, a program, an array moved
    # there) waits for the slice's remap before it fails with DataLossError; 0 fails at
    # once. Work whose inputs were lost with the slice fails at once either way.
    remap_wait_seconds: float = 120.0
    # Quotas, per client (tenant), set where the controller runs; 0 is no quota. The
    # most devices one client's slices may hold at once, its lost slices included
    # (they come back when remapped).
    tenant_max_devices: int = 0
    # The most bytes of one client's arrays a host's object store holds; each host is
    # told at registration. Past it that client's puts, programs and transfers into the
    # host fail with ResourceExhaustedError, and the others' go on.
    tenant_store_bytes: int = 0
    # Bytes of freed receive buffers a host's process keeps for the next large message of
    # their size (see wire/_recvpool): fresh memory costs page faults and, in a virtual
    # machine that reports freed memory to its host, the host's faults as well. 0 keeps
    # none.
    receive_pool_bytes: int = 1 << 30
    # The folder under which hosts write and read checkpoints (pw.save, pw.restore) and
    # write profiles (client.profile); empty: anywhere the host's own user may. Files are
    # the hosts' user's, whichever tenant asked: a cluster several people share confines
    # them here.
    checkpoint_root: str = ""
    # Whether hosts run Python functions clients send them (pw.colocated), in their own
    # process beside the devices. Off, such a function fails as a value on every call.
    # Any client of the Dask scheduler can run code on its workers anyway (Dask's
    # client.run); this turns off pathways_nb's own way.
    colocated_python: bool = True

    def __post_init__(self) -> None:
        # Counts with no "off" value: at 0 the gang scheduler runs nothing, a client's
        # first program blocks for good, the event log keeps nothing, a host keeps no
        # program to run.
        for name in (
            "inflight_window",
            "max_queued_per_client",
            "event_log_size",
            "host_executables",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name} must be at least 1; got {getattr(self, name)} "
                    f"(PATHWAYS_{name.upper()})"
                )
        # A limit of a few bytes refuses even a hello, and the peer only times out; a
        # kilobyte is a floor against a value meant in MiB or GiB, not a working size.
        for name in ("max_control_message", "max_data_message"):
            if getattr(self, name) < MIN_MESSAGE_LIMIT:
                raise ValueError(
                    f"{name} is a size in bytes, at least {MIN_MESSAGE_LIMIT} (the default "
                    f"is {getattr(Config, name)}); got {getattr(self, name)} "
                    f"(PATHWAYS_{name.upper()})"
                )
        # A lease or host timeout of 0 lapses every client's lease, or loses every host,
        # at once; a wait of 0 fails at once, as asked. nan would silently mean "never".
        for name, zero_ok in (
            ("lease_seconds", False),
            ("host_timeout_seconds", False),
            ("put_wait_seconds", True),
            ("remap_wait_seconds", True),
        ):
            value = getattr(self, name)
            if not ((value >= 0 if zero_ok else value > 0) and math.isfinite(value)):
                least = (
                    "0 or more"
                    if zero_ok
                    else "above 0 (clients and hosts beat once a second: give it several)"
                )
                raise ValueError(
                    f"{name} must be a finite number of seconds, {least}; got {value} "
                    f"(PATHWAYS_{name.upper()})"
                )
        if self.receive_pool_bytes < 0:
            raise ValueError(
                "receive_pool_bytes must be 0 (keep no buffers) or a positive number of "
                f"bytes; got {self.receive_pool_bytes} (PATHWAYS_RECEIVE_POOL_BYTES)"
            )
        for name in ("tenant_max_devices", "tenant_store_bytes", "store_limit_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{name} must be 0 (no limit) or a positive number; got "
                    f"{getattr(self, name)} (PATHWAYS_{name.upper()})"
                )
        if self.checkpoint_root and not os.path.isabs(self.checkpoint_root):
            raise ValueError(
                "checkpoint_root must be an absolute path (or empty: no confinement); got "
                f"{self.checkpoint_root!r} (PATHWAYS_CHECKPOINT_ROOT)"
            )
        if not 0 <= self.cpu_device_nice <= 19:
            raise ValueError(
                f"cpu_device_nice must be a nice value from 0 (off) to 19; "
                f"got {self.cpu_device_nice} (PATHWAYS_CPU_DEVICE_NICE)"
            )

    def check_checkpoint_root(self) -> None:
        """Raise ValueError if ``checkpoint_root`` is set but is no folder on this machine.

        Called where hosts start, not on construction: a client's machine need not have
        the hosts' folder. A missing one is refused rather than made, since a mistyped
        confinement would otherwise pass unnoticed until the first save."""
        root = self.checkpoint_root
        if root and not os.path.isdir(root):
            what = "is not a folder" if os.path.exists(root) else "does not exist"
            raise ValueError(
                f"checkpoint_root {root!r} {what} on this machine, where the hosts run "
                "(PATHWAYS_CHECKPOINT_ROOT): create the folder, or leave the variable "
                "empty for no confinement"
            )

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> Config:
        """The configuration the ``PATHWAYS_*`` variables of ``environ`` (this process's
        environment by default) give; a bad value raises ValueError naming it."""
        env = os.environ if environ is None else environ
        d = Config()
        return Config(
            inflight_window=_env_int(env, "PATHWAYS_INFLIGHT_WINDOW", d.inflight_window),
            max_queued_per_client=_env_int(
                env, "PATHWAYS_MAX_QUEUED_PER_CLIENT", d.max_queued_per_client
            ),
            event_log_size=_env_int(env, "PATHWAYS_EVENT_LOG_SIZE", d.event_log_size),
            max_control_message=_env_int(
                env, "PATHWAYS_MAX_CONTROL_MESSAGE", d.max_control_message
            ),
            max_data_message=_env_int(env, "PATHWAYS_MAX_DATA_MESSAGE", d.max_data_message),
            store_limit_bytes=_env_int(env, "PATHWAYS_STORE_LIMIT_BYTES", d.store_limit_bytes),
            lease_seconds=_env_float(env, "PATHWAYS_LEASE_SECONDS", d.lease_seconds),
            host_timeout_seconds=_env_float(
                env, "PATHWAYS_HOST_TIMEOUT_SECONDS", d.host_timeout_seconds
            ),
            put_wait_seconds=_env_float(env, "PATHWAYS_PUT_WAIT_SECONDS", d.put_wait_seconds),
            host_executables=_env_int(env, "PATHWAYS_HOST_EXECUTABLES", d.host_executables),
            cpu_device_nice=_env_int(env, "PATHWAYS_CPU_DEVICE_NICE", d.cpu_device_nice),
            cpu_device_idle=_env_bool(env, "PATHWAYS_CPU_DEVICE_IDLE", d.cpu_device_idle),
            cpu_device_spread=_env_bool(env, "PATHWAYS_CPU_DEVICE_SPREAD", d.cpu_device_spread),
            remap_lost_slices=_env_bool(env, "PATHWAYS_REMAP_LOST_SLICES", d.remap_lost_slices),
            remap_wait_seconds=_env_float(env, "PATHWAYS_REMAP_WAIT_SECONDS", d.remap_wait_seconds),
            tenant_max_devices=_env_int(env, "PATHWAYS_TENANT_MAX_DEVICES", d.tenant_max_devices),
            tenant_store_bytes=_env_int(env, "PATHWAYS_TENANT_STORE_BYTES", d.tenant_store_bytes),
            receive_pool_bytes=_env_int(env, "PATHWAYS_RECEIVE_POOL_BYTES", d.receive_pool_bytes),
            checkpoint_root=env.get("PATHWAYS_CHECKPOINT_ROOT", d.checkpoint_root),
            colocated_python=_env_bool(env, "PATHWAYS_COLOCATED_PYTHON", d.colocated_python),
        )


def default_config() -> Config:
    """The configuration of this process, from its environment."""
    return Config.from_env()
