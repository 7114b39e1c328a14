"""The shared core: versions, handle ids, mesh and sharding specs, configuration."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from jax.sharding import PartitionSpec as P

from pathways_nb._core import (
    Config,
    HandleAllocator,
    Versions,
    decode_mesh,
    decode_spec,
    default_config,
    encode_mesh,
    encode_spec,
    handle_owner,
    local_versions,
    validate_mesh_shape,
)
from pathways_nb._core._ids import TENANT_SHIFT
from pathways_nb._core._versions import PROTOCOL_VERSION

V = Versions(protocol=1, package="0.1.0", jax="0.10.2", jaxlib="0.10.2", export_max=9, export_min=9)
FIX = (
    "Install the same versions on both sides (upgrade whichever of the client or the "
    "controller is older, e.g. `pip install -U pathways_nb jax jaxlib`)."
)


def test_equal_versions_match() -> None:
    assert V.mismatch(dataclasses.replace(V), "client", "controller") is None


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"protocol": 2}, "wire protocol 1 on the client, 2 on the controller"),
        ({"package": "0.2.0"}, "pathways_nb 0.1.0 on the client, 0.2.0 on the controller"),
        ({"jax": "0.10.3"}, "jax 0.10.2 on the client, 0.10.3 on the controller"),
        ({"jaxlib": "0.10.1"}, "jaxlib 0.10.2 on the client, 0.10.1 on the controller"),
        (
            {"export_min": 10, "export_max": 12},
            "jax.export calling conventions 9..9 on the client, 10..12 on the controller",
        ),
    ],
)
def test_a_mismatch_names_both_sides_and_the_fix(changes: dict[str, Any], problem: str) -> None:
    other = dataclasses.replace(V, **changes)
    assert V.mismatch(other, "client", "controller") == f"{problem}. {FIX}"


def test_several_mismatches_are_listed_together() -> None:
    other = dataclasses.replace(V, protocol=2, jax="0.9.0")
    assert V.mismatch(other, "host h0", "controller") == (
        "wire protocol 1 on the host h0, 2 on the controller; "
        "jax 0.10.2 on the host h0, 0.9.0 on the controller. Install the same versions on "
        "both sides (upgrade whichever of the host h0 or the controller is older, e.g. "
        "`pip install -U pathways_nb jax jaxlib`)."
    )


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [((5, 9), (9, 12)), ((5, 9), (1, 5)), ((5, 9), (6, 7)), ((5, 9), (-1, -1)), ((-1, -1), (1, 2))],
)
def test_export_ranges_that_overlap_or_are_unknown_match(
    mine: tuple[int, int], theirs: tuple[int, int]
) -> None:
    a = dataclasses.replace(V, export_min=mine[0], export_max=mine[1])
    b = dataclasses.replace(V, export_min=theirs[0], export_max=theirs[1])
    assert a.mismatch(b, "client", "host") is None
    assert b.mismatch(a, "host", "client") is None


def test_versions_roundtrip_and_reject_bad_mappings() -> None:
    assert Versions.from_dict(V.to_dict()) == V
    assert Versions.from_dict(V.to_dict() | {"future": 1}) == V
    with pytest.raises(ValueError, match="expected a versions mapping, got list"):
        Versions.from_dict([1])
    d = V.to_dict()
    del d["jax"], d["export_min"]
    with pytest.raises(ValueError, match=r"versions mapping lacks \['export_min', 'jax'\]"):
        Versions.from_dict(d)


def test_local_versions_without_export_leave_the_range_unknown() -> None:
    v = local_versions(with_export=False)
    assert (v.protocol, v.export_min, v.export_max) == (PROTOCOL_VERSION, -1, -1)
    full = local_versions()
    assert 0 <= full.export_min <= full.export_max
    assert v.mismatch(full, "controller", "host h0") is None


def test_handles_carry_their_tenant_in_the_high_bits() -> None:
    a, b = HandleAllocator(3), HandleAllocator(4)
    hs = [a.next() for _ in range(3)]
    assert hs == [(3 << TENANT_SHIFT) | n for n in (1, 2, 3)]
    assert [handle_owner(h) for h in hs] == [3, 3, 3]
    assert handle_owner(b.next()) == 4
    top = HandleAllocator(2**23 - 1).next()
    assert handle_owner(top) == 2**23 - 1 and top < 2**63


@pytest.mark.parametrize("tenant", [0, -1, 2**23])
def test_tenant_ids_out_of_range_are_refused(tenant: int) -> None:
    with pytest.raises(ValueError, match=rf"tenant id must be in \[1, 2\*\*23\), got {tenant}"):
        HandleAllocator(tenant)


def test_running_out_of_handle_ids_says_to_reconnect() -> None:
    alloc = HandleAllocator(1)
    last = (1 << TENANT_SHIFT) - 1
    # Fast-forward the counter rather than hand out 2**40 ids.
    alloc._counter = itertools.count(last)
    assert alloc.next() == (1 << TENANT_SHIFT) | last
    with pytest.raises(OverflowError, match="used every handle id; reconnect"):
        alloc.next()


@pytest.mark.parametrize(
    ("spec", "encoded"),
    [
        (P(), []),
        (P("data"), ["data"]),
        (P(None), [None]),
        (P(None, "data"), [None, "data"]),
        (P("data", None, ("a", "b")), ["data", None, ["a", "b"]]),
        (P(("x", "y", "z"), "w"), [["x", "y", "z"], "w"]),
    ],
)
def test_partition_specs_roundtrip(spec: P, encoded: list[Any]) -> None:
    assert encode_spec(spec) == encoded
    assert decode_spec(encoded) == spec
    assert decode_spec(encode_spec(spec)) == spec


def test_a_spec_entry_that_is_not_a_name_is_refused() -> None:
    with pytest.raises(TypeError, match="entries must be None, an axis name or a tuple of names"):
        encode_spec(P(P.UNCONSTRAINED))


def test_mesh_shapes_roundtrip_in_order() -> None:
    shape = {"model": 2, "data": 4}
    assert encode_mesh(shape) == [["model", 2], ["data", 4]]
    assert list(decode_mesh(encode_mesh(shape)).items()) == [("model", 2), ("data", 4)]


def test_validate_mesh_shape_returns_an_ordered_copy() -> None:
    shape = {"data": 2, "model": 2}
    out = validate_mesh_shape(shape)
    assert out == shape and out is not shape and list(out) == ["data", "model"]


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([("data", 4)], r"a virtual slice is a named mesh such as \{'data': 4\}"),
        ({}, r"a virtual slice is a named mesh .*; got \{\}"),
        ({1: 4}, r"mesh axis names must be identifiers; got 1 in \{1: 4\}"),
        ({"my-axis": 4}, r"mesh axis names must be identifiers; got 'my-axis'"),
        ({"data": 0}, r"mesh axis sizes must be positive integers; got data=0 in"),
        ({"data": True}, r"must be positive integers; got data=True"),
        ({"data": 2.0}, r"must be positive integers; got data=2.0"),
    ],
)
def test_validate_mesh_shape_says_what_is_wrong(shape: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_mesh_shape(shape)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("PATHWAYS_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert Config.from_env() == Config()
    assert default_config() == Config()
    clean_env.setenv("PATHWAYS_INFLIGHT_WINDOW", "")
    assert Config.from_env().inflight_window == 16


def test_config_reads_every_pathways_variable(clean_env: pytest.MonkeyPatch) -> None:
    values = {
        "inflight_window": "4",
        "max_queued_per_client": "100",
        "event_log_size": "50",
        "max_control_message": "1024",
        "max_data_message": "2048",
        "store_limit_bytes": "4096",
        "lease_seconds": "2.5",
        "host_timeout_seconds": "9",
        "put_wait_seconds": "7",
        "host_executables": "32",
        "cpu_device_nice": "5",
        "cpu_device_idle": "0",
        "cpu_device_spread": "1",
        "remap_lost_slices": "0",
        "remap_wait_seconds": "12.5",
        "tenant_max_devices": "6",
        "tenant_store_bytes": "8192",
        "receive_pool_bytes": "65536",
        "checkpoint_root": "/srv/checkpoints",
        "colocated_python": "false",
    }
    assert set(values) == {f.name for f in dataclasses.fields(Config)}
    for field, raw in values.items():
        clean_env.setenv(f"PATHWAYS_{field.upper()}", raw)
    assert Config.from_env() == Config(
        inflight_window=4,
        max_queued_per_client=100,
        event_log_size=50,
        max_control_message=1024,
        max_data_message=2048,
        store_limit_bytes=4096,
        lease_seconds=2.5,
        host_timeout_seconds=9.0,
        put_wait_seconds=7.0,
        host_executables=32,
        cpu_device_nice=5,
        cpu_device_idle=False,
        cpu_device_spread=True,
        remap_lost_slices=False,
        remap_wait_seconds=12.5,
        tenant_max_devices=6,
        tenant_store_bytes=8192,
        receive_pool_bytes=65536,
        checkpoint_root="/srv/checkpoints",
        colocated_python=False,
    )


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("PATHWAYS_INFLIGHT_WINDOW", "sixteen", "must be an integer; got 'sixteen'"),
        ("PATHWAYS_STORE_LIMIT_BYTES", "1.5e9", "must be an integer; got '1.5e9'"),
        ("PATHWAYS_LEASE_SECONDS", "30s", "must be a number; got '30s'"),
        ("PATHWAYS_CPU_DEVICE_SPREAD", "yes", "must be 1 or 0 (true/false); got 'yes'"),
    ],
)
def test_a_bad_variable_is_named_in_the_error(
    clean_env: pytest.MonkeyPatch, name: str, raw: str, message: str
) -> None:
    clean_env.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        Config.from_env()
    assert str(info.value) == f"environment variable {name} {message}"
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("nice", ["-1", "20"])
def test_a_nice_value_out_of_range_says_which_range(
    clean_env: pytest.MonkeyPatch, nice: str
) -> None:
    clean_env.setenv("PATHWAYS_CPU_DEVICE_NICE", nice)
    with pytest.raises(ValueError, match=f"from 0 \\(off\\) to 19; got {nice} "):
        Config.from_env()


def test_a_host_must_keep_at_least_one_executable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PATHWAYS_HOST_EXECUTABLES", "0")
    with pytest.raises(ValueError, match=r"at least 1; got 0 \(PATHWAYS_HOST_EXECUTABLES\)"):
        Config.from_env()


@pytest.mark.parametrize(
    "name",
    ["PATHWAYS_TENANT_MAX_DEVICES", "PATHWAYS_TENANT_STORE_BYTES", "PATHWAYS_STORE_LIMIT_BYTES"],
)
def test_a_limit_is_zero_or_positive(clean_env: pytest.MonkeyPatch, name: str) -> None:
    clean_env.setenv(name, "-4")
    with pytest.raises(
        ValueError, match=rf"0 \(no limit\) or a positive number; got -4 \({name}\)"
    ):
        Config.from_env()


@pytest.mark.parametrize("wait", ["-1", "inf", "nan"])
def test_a_remap_wait_must_be_finite_and_not_negative(
    clean_env: pytest.MonkeyPatch, wait: str
) -> None:
    clean_env.setenv("PATHWAYS_REMAP_WAIT_SECONDS", wait)
    with pytest.raises(ValueError, match=r"0 or more; got .* \(PATHWAYS_REMAP_WAIT_SECONDS\)"):
        Config.from_env()


@pytest.mark.parametrize(
    ("name", "raw", "bound"),
    [
        ("PATHWAYS_INFLIGHT_WINDOW", "0", "at least 1"),
        ("PATHWAYS_INFLIGHT_WINDOW", "-3", "at least 1"),
        ("PATHWAYS_MAX_QUEUED_PER_CLIENT", "0", "at least 1"),
        ("PATHWAYS_MAX_QUEUED_PER_CLIENT", "-1", "at least 1"),
        ("PATHWAYS_EVENT_LOG_SIZE", "0", "at least 1"),
        ("PATHWAYS_EVENT_LOG_SIZE", "-5", "at least 1"),
        ("PATHWAYS_HOST_EXECUTABLES", "0", "at least 1"),
        ("PATHWAYS_MAX_CONTROL_MESSAGE", "0", "at least 1024"),
        ("PATHWAYS_MAX_CONTROL_MESSAGE", "-1", "at least 1024"),
        ("PATHWAYS_MAX_DATA_MESSAGE", "0", "at least 1024"),
        ("PATHWAYS_MAX_DATA_MESSAGE", "1023", "at least 1024"),
        ("PATHWAYS_LEASE_SECONDS", "0", "above 0"),
        ("PATHWAYS_LEASE_SECONDS", "-1", "above 0"),
        ("PATHWAYS_LEASE_SECONDS", "nan", "above 0"),
        ("PATHWAYS_LEASE_SECONDS", "inf", "above 0"),
        ("PATHWAYS_HOST_TIMEOUT_SECONDS", "0", "above 0"),
        ("PATHWAYS_HOST_TIMEOUT_SECONDS", "-1", "above 0"),
        ("PATHWAYS_HOST_TIMEOUT_SECONDS", "nan", "above 0"),
        ("PATHWAYS_HOST_TIMEOUT_SECONDS", "inf", "above 0"),
        ("PATHWAYS_PUT_WAIT_SECONDS", "-1", "0 or more"),
        ("PATHWAYS_PUT_WAIT_SECONDS", "nan", "0 or more"),
        ("PATHWAYS_PUT_WAIT_SECONDS", "inf", "0 or more"),
    ],
)
def test_a_count_size_or_duration_out_of_range_is_refused_naming_the_variable(
    clean_env: pytest.MonkeyPatch, name: str, raw: str, bound: str
) -> None:
    """Each of these was accepted, then hung a client, timed every host out, or killed
    the scheduler with a message that named no variable."""
    clean_env.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        Config.from_env()
    field = name.removeprefix("PATHWAYS_").lower()
    parse = int if isinstance(getattr(Config(), field), int) else float
    assert bound in str(info.value)
    assert str(info.value).endswith(f"got {parse(raw)} ({name})"), str(info.value)


def test_zero_is_kept_where_it_means_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PATHWAYS_PUT_WAIT_SECONDS", "0")
    clean_env.setenv("PATHWAYS_REMAP_WAIT_SECONDS", "0")
    config = Config.from_env()
    assert (config.put_wait_seconds, config.remap_wait_seconds) == (0.0, 0.0)
    assert Config(max_control_message=1024, max_data_message=1024).max_data_message == 1024


def test_a_checkpoint_root_must_be_a_folder_where_the_hosts_run(tmp_path: Path) -> None:
    Config(checkpoint_root=str(tmp_path)).check_checkpoint_root()
    Config().check_checkpoint_root()  # no confinement: nothing to find
    missing = Config(checkpoint_root=str(tmp_path / "nope"))  # a client's config may name it
    with pytest.raises(
        ValueError, match=r"'.*nope' does not exist .* \(PATHWAYS_CHECKPOINT_ROOT\)"
    ):
        missing.check_checkpoint_root()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"is not a folder .* create the folder"):
        Config(checkpoint_root=str(tmp_path / "file")).check_checkpoint_root()


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().inflight_window = 3  # type: ignore[misc]


def test_local_cluster_retunes_dask_housekeeping_left_at_its_default() -> None:
    import dask

    from pathways_nb.deploy._local import _DASK_TUNING, _dask_tuning

    stock = {key: default for key, default, _ in _DASK_TUNING}
    ours = {
        "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
        "DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "500ms",
        "DASK_DISTRIBUTED__WORKER__PROFILE__CYCLE": "5s",
        "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
        "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "500ms",
    }
    with dask.config.set(stock):
        assert _dask_tuning({}) == ours
        # A variable in the environment the cluster starts with wins.
        got = _dask_tuning({"DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "20ms"})
        assert got == {k: v for k, v in ours.items() if "TICK" not in k}
    # So does a value the user configured (a file, dask.config.set).
    with dask.config.set(stock | {"distributed.admin.tick.interval": "50ms"}):
        assert _dask_tuning({}) == {k: v for k, v in ours.items() if "TICK" not in k}
    # Every setting exists in this Dask (a misspelt key would be ignored), with the
    # default named here.
    import distributed  # noqa: F401  (loads distributed's defaults into dask.config)
    from dask.utils import parse_timedelta

    for key, default, _ in _DASK_TUNING:
        value = dask.config.get(key, None)
        assert value is not None, key
        assert parse_timedelta(value) == parse_timedelta(default), key


def test_an_address_where_nothing_answers_is_a_clear_error() -> None:
    import socket

    from pathways_nb._core import BrokenError
    from pathways_nb.client._discovery import ask_scheduler

    with socket.socket() as s:  # a port that was free a moment ago, nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Refused: said at once, where Dask would retry for the whole timeout (30 s here).
    with pytest.raises(
        BrokenError, match=r"nothing listens at tcp://127.0.0.1:\d+ \(connection refused\)"
    ):
        ask_scheduler(f"tcp://127.0.0.1:{port}")
    with pytest.raises(BrokenError, match=r"names a host that does not resolve"):
        ask_scheduler("tcp://no-such-host.invalid:8786")
    # Listening but never answering (the kernel accepts for it): Dask's timeout.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(
            BrokenError, match=r"nothing answered at tcp://127.0.0.1:\d+ within 1 s"
        ):
            ask_scheduler(address, 1.0)


def test_config_reads_a_given_environment_as_this_processs(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PATHWAYS_INFLIGHT_WINDOW", "8")
    given = {"PATHWAYS_TENANT_MAX_DEVICES": "4"}
    assert Config.from_env(given) == Config(tenant_max_devices=4)
    with pytest.raises(ValueError, match="PATHWAYS_TENANT_STORE_BYTES must be an integer"):
        Config.from_env({"PATHWAYS_TENANT_STORE_BYTES": "4GB"})
    assert Config.from_env({"PATHWAYS_RECEIVE_POOL_BYTES": "0"}).receive_pool_bytes == 0
    with pytest.raises(ValueError, match=r"receive_pool_bytes must be 0 .* got -1"):
        Config.from_env({"PATHWAYS_RECEIVE_POOL_BYTES": "-1"})


def test_public_namespaces_list_their_public_names_only() -> None:
    """What tab completion shows (dir) is each package's __all__, every name of which
    resolves: no typing helpers or imported modules beside them."""
    import pathways_nb as pw

    for module in (pw, pw.viz, pw.data):
        assert sorted(dir(module)) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_the_public_settings_stand_in_for_jaxs_trace_context() -> None:
    import jax

    from pathways_nb.client import _tracectx

    for ctx in (_tracectx.trace_context, _tracectx._public_settings):
        before = ctx()
        assert ctx() == before and hash(ctx()) == hash(before)
        with jax.numpy_rank_promotion("raise"):
            assert ctx() != before
        with jax.enable_x64(True):
            assert ctx() != before
        assert ctx() == before
