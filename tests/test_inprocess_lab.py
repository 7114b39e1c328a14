"""JupyterLab's Pathways panel, its server half: the boards it draws from, the clusters
it offers and the addresses it accepts (an in-process cluster; the browser half is in
tests/browser/test_panel.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pathways_nb as pw
from pathways_nb.lab import lab_arguments
from pathways_nb.lab._boards import Board, Boards, Found, check_address, local_clusters
from pathways_nb.lab._handlers import board_snapshot


def test_a_board_shows_status_placement_and_timeline(
    cluster: pw.InProcessCluster, ran: pw.Client
) -> None:
    user = ran
    panels: list[pw.Client] = []

    def connect(found: Found) -> pw.Client:
        panels.append(cluster.client(name="JupyterLab", observer=True))
        return panels[-1]

    try:
        board = Board(Found("tcp://127.0.0.1:8786", "given"), connect)
        snap = board.snapshot()
        assert "error" not in snap, snap.get("error")
        assert snap["summary"] == user.status().summary
        assert "1 tenants" in snap["summary"] and "JupyterLab" not in snap["html"]
        assert "<td>enc</td>" in snap["html"] and "<td>dec</td>" in snap["html"]
        # The newest events are every tenant's: the user's programs, not the panel's none.
        assert "<td>decode</td>" in snap["html"].split("latest events")[1]
        held = {(d["island"], d["device"]): d for d in snap["devices"] if d["slice"]}
        assert {d["slice"] for d in held.values()} == {"enc", "dec"} and len(held) == 4
        assert {d["program"] for d in held.values()} == {"encode", "decode"}
        # The cluster's last 30 s, every tenant's (earlier tests' too): the user's part.
        mine = [r for r in snap["rows"] if r["tenant"] == user.tenant]
        kinds = [r["kind"] for r in mine]
        assert kinds.count("program") == 6 and kinds.count("transfer") == 3
        assert {r["lane"] for r in mine} <= set(snap["lanes"]) and snap["span_ms"] > 0
        assert snap["tenants"] == {str(user.tenant): f"tenant-{user.tenant}"}
        json.dumps(snap)  # what the handler sends

        # Only what is new crosses the wire, asked for once a poll; a second look keeps
        # the rows drawn.
        asked: list[int] = []
        panel = panels[0]
        real = panel.event_rows
        panel.event_rows = lambda *a, **k: asked.append(1) or real(*a, **k)  # type: ignore[method-assign]
        again = board.snapshot()
        assert len(again["rows"]) == len(snap["rows"]) and len(panels) == 1
        assert len(asked) == 1
    finally:
        for c in panels:
            c.close()


def test_a_board_reports_a_cluster_it_cannot_reach_and_tries_again() -> None:
    calls = []

    def connect(found: Found) -> pw.Client:
        calls.append(found.address)
        raise ConnectionRefusedError(f"nothing listens at {found.address}")

    board = Board(Found("tcp://127.0.0.1:1", "given"), connect)
    snap = board.snapshot()
    assert snap["error"].startswith("cannot show the cluster at tcp://127.0.0.1:1:")
    assert "ConnectionRefusedError: nothing listens" in snap["error"]
    board.snapshot()
    assert calls == ["tcp://127.0.0.1:1"] * 2


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("tcp://10.0.0.5:8786", "tcp://10.0.0.5:8786"),
        (" 127.0.0.1:8786 ", "tcp://127.0.0.1:8786"),
        ("tls://scheduler:8786", "tls://scheduler:8786"),
    ],
)
def test_addresses_the_panel_accepts(given: str, expected: str) -> None:
    assert check_address(given) == expected


@pytest.mark.parametrize("given", ["", "nonsense", "http://h:1", "tcp://h:port", None, 8786])
def test_addresses_the_panel_refuses_say_what_it_takes(given: object) -> None:
    with pytest.raises(ValueError, match=r"tcp://"):
        check_address(given)


# Superscript two, Arabic-Indic 123 and fullwidth 8786: str.isdigit() takes them all.
@pytest.mark.parametrize(
    "port",
    ["99999999", "65536", "0", "00", "\u00b2", "\u0661\u0662\u0663", "\uff18\uff17\uff18\uff16"],
)
def test_a_port_the_panel_refuses_is_named_with_the_range_it_takes(port: str) -> None:
    with pytest.raises(ValueError, match=rf"from 1 to 65535 in ASCII digits.*got port '{port}'"):
        check_address(f"tcp://127.0.0.1:{port}")


def test_ports_at_the_ends_of_the_range_are_accepted() -> None:
    assert check_address("127.0.0.1:1") == "tcp://127.0.0.1:1"
    assert check_address("tls://[::1]:65535") == "tls://[::1]:65535"


GOOD = "tcp://127.0.0.1:8786"


class _Stuck:
    """A connect that never answers until released, as an address that accepts TCP and
    says nothing does for the client's timeout."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def __call__(self, found: Found) -> pw.Client:
        self.waiting.release()
        self.release.wait(60)
        raise TimeoutError(f"nothing answered at {found.address}")


def test_boards_that_never_answer_do_not_hold_up_another_board(
    cluster: pw.InProcessCluster,
) -> None:
    stuck = _Stuck()
    panels: list[pw.Client] = []

    def connect(found: Found) -> pw.Client:
        if found.address != GOOD:
            return stuck(found)
        panels.append(cluster.client(name="JupyterLab", observer=True))
        return panels[-1]

    boards = Boards(connect=connect)
    shared = ThreadPoolExecutor(max_workers=2)  # as few as the server's handlers share

    async def polls() -> None:
        bad = [
            asyncio.ensure_future(board_snapshot(lambda: boards, f"127.0.0.{i}:9", shared))
            for i in (2, 3)
        ]
        for _ in bad:  # both are connecting, and will not get an answer
            await asyncio.get_running_loop().run_in_executor(None, stuck.waiting.acquire)
        snap, status = await board_snapshot(lambda: boards, GOOD, shared)
        assert status == 200 and "error" not in snap, snap
        assert not any(b.done() for b in bad) and not stuck.release.is_set()
        stuck.release.set()
        for b in bad:
            snap, status = await b
            assert status == 200 and "TimeoutError: nothing answered" in snap["error"]
        snap, status = await board_snapshot(lambda: boards, "127.0.0.1:٩", shared)
        assert status == 400 and "got port '٩'" in snap["error"]

    try:
        asyncio.run(polls())
    finally:
        stuck.release.set()
        boards.close()
        shared.shutdown()
        for c in panels:
            c.close()


def test_looking_up_other_addresses_keeps_a_connected_boards_client(
    cluster: pw.InProcessCluster,
) -> None:
    panels: list[pw.Client] = []

    def connect(found: Found) -> pw.Client:
        if found.address.endswith(":1"):
            raise ConnectionRefusedError(f"nothing listens at {found.address}")
        panels.append(cluster.client(name="JupyterLab", observer=True))
        return panels[-1]

    boards = Boards(connect=connect, max_boards=2)
    try:
        good = boards.board(GOOD)
        assert "error" not in good.snapshot()
        for i in range(2, 6):  # addresses typed by mistake, looked at once or not at all
            other = boards.board(f"tcp://127.0.0.{i}:1")
            if i % 2:
                assert "ConnectionRefusedError" in other.submit().result()["error"]
        assert boards.board(GOOD) is good and good.connected and not panels[0].closed
        # Past max_boards connected ones, the board unused longest closes its client.
        second = boards.board("tcp://127.0.0.9:8786")
        assert "error" not in second.submit().result()
        boards.board("tcp://127.0.0.10:8786").submit().result()
        assert boards.board(GOOD) is not good
        good.close(wait=True)  # already closed: this waits for its thread to finish
        assert panels[0].closed and "closed its board" in good.snapshot()["error"]
    finally:
        boards.close()
        for c in panels:
            c.close()


def test_closing_a_board_waits_for_no_refresh_in_progress() -> None:
    stuck = _Stuck()
    board = Board(Found("tcp://127.0.0.1:9", "given"), stuck)
    pending = board.submit()
    stuck.waiting.acquire()  # connecting, and no answer comes
    board.close()  # returns at once; the refresh in progress keeps the board's thread
    board.close()
    assert not pending.done()
    assert "closed its board" in board.submit().result()["error"]
    stuck.release.set()
    assert "TimeoutError" in pending.result(timeout=30)["error"]


def test_local_clusters_are_found_by_their_scheduler_files(tmp_path: Path) -> None:
    def cluster_dir(name: str, body: str, mtime: float) -> None:
        d = tmp_path / f"pathways-cluster-{name}"
        d.mkdir()
        (d / "scheduler.json").write_text(body)
        os.utime(d / "scheduler.json", (mtime, mtime))

    cluster_dir("old", json.dumps({"address": "tcp://127.0.0.1:1001"}), 1000.0)
    cluster_dir("new", json.dumps({"address": "tcp://127.0.0.1:1002"}), 2000.0)
    cluster_dir("half", '{"addr', 3000.0)  # being written
    cluster_dir("odd", json.dumps({"address": 5}), 3000.0)
    found = local_clusters(str(tmp_path))
    assert [f.address for f in found] == ["tcp://127.0.0.1:1002", "tcp://127.0.0.1:1001"]
    assert all(f.source == "local" for f in found)


def test_boards_offer_configured_then_local_clusters_and_keep_a_bounded_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "pathways-cluster-a"
    d.mkdir()
    (d / "scheduler.json").write_text(json.dumps({"address": "tcp://127.0.0.1:1002"}))
    monkeypatch.setenv("PATHWAYS_ADDRESS", "127.0.0.1:1003")
    closed = []

    class Fake:
        def __init__(self, address: str) -> None:
            self.address = address

        def close(self) -> None:
            closed.append(self.address)

    boards = Boards(
        ["tcp://127.0.0.1:1001"], connect=lambda f: Fake(f.address), tmp=str(tmp_path), max_boards=2
    )  # type: ignore[arg-type,return-value]
    assert [(f.address, f.source) for f in boards.found()] == [
        ("tcp://127.0.0.1:1001", "configured"),
        ("tcp://127.0.0.1:1003", "configured"),
        ("tcp://127.0.0.1:1002", "local"),
    ]
    assert boards.problems == []
    assert boards.board("127.0.0.1:1002").found.source == "local"
    assert boards.board("tcp://127.0.0.1:1002") is boards.board("127.0.0.1:1002")
    for port in (1004, 1005):
        b = boards.board(f"tcp://127.0.0.1:{port}")
        b.snapshot()  # connects (and fails to read a status from the fake: an error shown)
    assert boards.board("tcp://127.0.0.1:1005").found.source == "given"
    # A client that fails is closed, and the board shows why.
    assert closed == ["tcp://127.0.0.1:1004", "tcp://127.0.0.1:1005"]
    assert "AttributeError" in boards.board("tcp://127.0.0.1:1005").snapshot()["error"]
    with pytest.raises(ValueError, match="got 'nonsense'"):
        boards.board("nonsense")
    boards.close()

    # Addresses that are not one are skipped and said, not fatal to the server.
    monkeypatch.setenv("PATHWAYS_ADDRESS", "http://x")
    odd = Boards(["tcp://127.0.0.1:1001", "nowhere"], tmp=str(tmp_path))
    assert [f.address for f in odd.found()] == ["tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"]
    assert [p.split(":")[0] for p in odd.problems] == ["configured", "PATHWAYS_ADDRESS"]
    assert "got 'http://x'" in odd.problems[1]


def test_pathways_nb_lab_loads_both_halves_from_this_install() -> None:
    args = lab_arguments()
    assert "--ServerApp.jpserver_extensions=pathways_nb.lab=True" in args
    path = Path(args[1].split("=", 1)[1])
    built = json.loads((path / "pathways-nb-lab" / "package.json").read_text())
    remote = path / "pathways-nb-lab" / built["jupyterlab"]["_build"]["load"]
    assert remote.is_file()


def test_an_observer_reads_status_and_events_and_nothing_else(
    cluster: pw.InProcessCluster, ran: pw.Client
) -> None:
    user = ran
    watcher = cluster.client(name="dashboard", observer=True)
    try:
        assert pw.Client.current() is user  # an observer never becomes current
        status = watcher.status()
        assert [r[0] for r in status.rows["tenants"]] == [user.tenant]
        assert "decode" in {e[4] for e in status.rows["events"]}  # every tenant's newest
        assert "1 tenants" in status.summary
        names = {e[4] for e in watcher.event_rows(0, all_tenants=True).rows}
        assert {"encode", "decode"} <= names
        # It runs nothing: no event of the log is its own, not even its joining.
        assert all(e[2] != watcher.tenant for e in watcher.event_rows(0, all_tenants=True).rows)
        with pytest.raises(pw.ClosedError, match=r"observes only .*observer=True"):
            watcher.allocate({"x": 2})
        # A raw request past the client's own check: the controller refuses it too,
        # and both clients go on.
        with pytest.raises(pw.PathwaysError, match="'allocate' is refused: this client observes"):
            watcher._ask({"t": "allocate", "mesh": [["x", 2]], "name": None})
        assert watcher.status().summary == status.summary
        user.status()
        # Nor do hosts serve it: its welcome carried no token to show them.
        host = user.slices[0].data_address
        with pytest.raises(pw.VersionMismatchError, match="does not prove tenant"):
            watcher._hello_host(host)
        with pytest.raises(TypeError, match="observer is True or False"):
            pw.Client(cluster, observer="yes")  # type: ignore[arg-type]
    finally:
        watcher.close()


def test_the_pathways_nb_lab_command_starts_jupyter_lab() -> None:
    import jupyterlab

    cli = [sys.executable, "-m", "pathways_nb.deploy._cli"]
    out = subprocess.run([*cli, "lab", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == jupyterlab.__version__
    # Other commands still refuse arguments they do not take.
    bad = subprocess.run([*cli, "demo", "--bogus"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


def test_the_server_extension_loads_jax_only_when_a_panel_asks() -> None:
    code = (
        "import sys, types, logging\n"
        "import tornado.web\n"
        "import pathways_nb.lab as lab\n"
        "app = tornado.web.Application(base_url='/')\n"
        "server = types.SimpleNamespace(web_app=app, log=logging.getLogger('x'))\n"
        "lab._load_jupyter_server_extension(server)\n"
        "print(sorted(m for m in ('jax', 'pandas', 'pathways_nb.client') if m in sys.modules))\n"
        "boards = app.settings['pathways_nb_boards'].get()\n"
        "print(type(boards).__name__, 'jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "Boards True"]


def test_pathways_nb_lab_without_jupyterlab_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from pathways_nb.deploy._cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real(name)
    )
    assert main(["lab"]) == 1
    assert "pip install 'pathways_nb[lab]'" in capsys.readouterr().err
