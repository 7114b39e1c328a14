"""A JupyterLab server and Debian's Chromium, for the browser tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def lab_server(
    root: Path, log_path: Path, extra: list[str] = (), env: dict[str, str] | None = None
) -> Iterator[str]:
    """``jupyter lab`` serving ``root`` on a free port, no token; yields its URL."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: apt-get install chromium")
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.token=",
        "--ServerApp.password=",
        "--ServerApp.allow_root=True",
        "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # A workspace of its own: the layout one run leaves (a panel open) is not the next's.
        f"--LabApp.workspaces_dir={log_path.parent / 'workspaces'}",
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            deadline = time.monotonic() + 90
            while True:  # until the server accepts connections
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        pytest.fail("jupyter lab did not start:\n" + log_path.read_text()[-3000:])
                    time.sleep(0.3)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def browser_page() -> Iterator[Any]:
    """A page of a headless Chromium, 1400 x 1000."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()
