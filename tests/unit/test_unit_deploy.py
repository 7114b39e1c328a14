"""The deploy side's own checks: the ``pathways-nb`` command's arguments and a worker's
``PATHWAYS_CPU_DEVICES``, refused before any process starts."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from pathways_nb._core import BrokenError
from pathways_nb.deploy import _demo, _serve
from pathways_nb.deploy._cli import main as cli
from pathways_nb.deploy._local import counted
from pathways_nb.deploy.worker import cpu_devices


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that gets past its checks fails the test instead of starting a cluster."""

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(_serve, "serve", started)
    monkeypatch.setattr(_serve, "status_report", started)
    monkeypatch.setattr(_demo, "run_demo", started)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["demo", "--islands", "0"],
            "argument --islands: must be a whole number, 1 or more; got '0'",
        ),
        (["demo", "--devices", "-1"], "argument --devices: must be a whole number, 1 or more"),
        (["demo", "--steps", "0"], "argument --steps: must be a whole number, 1 or more"),
        (["demo", "--islands", "100"], "up to 64; got islands=100"),
        (["cluster", "--islands", "0"], "argument --islands: must be a whole number"),
        (["status", "--timeout", "-1", "tcp://127.0.0.1:1"], "--timeout: must be a finite number"),
        (["status", "--timeout", "nan", "tcp://127.0.0.1:1"], "above 0, such as 10; got 'nan'"),
        (
            ["cluster", "--tls-ca-file", "/nope", "--tls-cert", "/nope", "--tls-key", "/nope"],
            "--tls-ca-file '/nope' cannot be read (No such file or directory)",
        ),
        (
            ["cluster", "--scheduler-file", "/nonexistent_dir/x.json"],
            "its folder '/nonexistent_dir' does not exist",
        ),
    ],
)
def test_bad_arguments_are_usage_errors_before_anything_starts(
    nothing_starts: None, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        cli(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"usage: pathways-nb {argv[0]} "), err


def test_a_scheduler_file_in_place_of_a_folder_or_unreadable_tls_file_is_refused(
    nothing_starts: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        cli(["cluster", "--scheduler-file", str(tmp_path)])
    assert "is a folder: name a file in it" in capsys.readouterr().err
    pem = tmp_path / "ca.pem"
    pem.write_text("")
    with pytest.raises(SystemExit):
        cli(["cluster", "--tls-ca-file", str(pem), "--tls-cert", str(pem), "--tls-key", "/nope"])
    assert "--tls-key '/nope' cannot be read" in capsys.readouterr().err


def test_the_demo_refuses_zero_steps_before_its_cluster_starts() -> None:
    with pytest.raises(ValueError, match=r"steps must be a whole number, 1 or more; got 0"):
        _demo.run_demo(1, 1, 0)


def test_the_cluster_command_counts_one_island_in_the_singular(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Cluster:
        scheduler_address = controller_address = "tcp://127.0.0.1:1"
        dashboard_link = ""
        security = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def check_alive(self) -> None:
            raise BrokenError("the scheduler exited")

        def close(self) -> None:
            pass

    monkeypatch.setattr(_serve, "LocalCluster", Cluster)
    out = io.StringIO()
    assert _serve.serve(1, 2, out=out, poll=0.01) == 1
    assert "pathways_nb cluster: 1 island x 2 cpu devices\n" in out.getvalue()
    assert _serve.serve(2, 1, out=out, poll=0.01) == 1
    assert "pathways_nb cluster: 2 islands x 1 cpu device\n" in out.getvalue()
    assert [counted(n, "island") for n in (0, 1, 2)] == ["0 islands", "1 island", "2 islands"]


@pytest.mark.parametrize("raw", ["abc", "1.5", "0", "-1"])
def test_a_workers_cpu_devices_must_be_a_whole_number_of_one_or_more(raw: str) -> None:
    """-1 was JAX's default (one device, silently), 0 an error naming neither."""
    with pytest.raises(ValueError) as info:
        cpu_devices({"PATHWAYS_CPU_DEVICES": raw})
    assert str(info.value) == (
        "environment variable PATHWAYS_CPU_DEVICES must be a whole number of simulated CPU "
        f"devices for this host, 1 or more (such as 4); got {raw!r}"
    )


def test_a_workers_cpu_devices_are_read_where_set() -> None:
    assert cpu_devices({"PATHWAYS_CPU_DEVICES": "4"}) == 4
    assert cpu_devices({"PATHWAYS_CPU_DEVICES": ""}) is None
    assert cpu_devices({}) is None
