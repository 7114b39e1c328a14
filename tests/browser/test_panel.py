"""JupyterLab's Pathways panel in a real browser, on a real cluster.

A ``pw.LocalCluster`` runs in this process; JupyterLab starts as ``pathways-nb lab``
starts it, with ``$PATHWAYS_ADDRESS`` naming the cluster. The panel must find the
cluster, show its status tables and placement map, draw one timeline bar per program
and transfer run after it opened, follow a slice's release, and say clearly when an
address has no cluster behind it; and open again, with its tab, when the page reloads.
It also starts a cluster of the server's own, puts the code that connects to it in a
notebook, and stops it, leaving no process behind.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import jax.numpy as jnp
import numpy as np
import pytest
from _lab import ARTIFACTS, browser_page, lab_server
from _processes import gone, tree
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from pathways_nb.lab import lab_arguments

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def cluster() -> Iterator[pw.LocalCluster]:
    with pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False) as c:
        yield c


@pytest.fixture(scope="module")
def lab(cluster: pw.LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("panel")
    log = tmp_path_factory.mktemp("panel-log") / "server.log"
    with lab_server(
        root, log, lab_arguments(), {"PATHWAYS_ADDRESS": cluster.scheduler_address}
    ) as url:
        yield url


def _count(page: Any, selector: str, n: int) -> None:
    page.wait_for_function(
        f"document.querySelectorAll({selector!r}).length === {n}", timeout=60_000
    )


def test_the_panel_follows_a_cluster(cluster: pw.LocalCluster, lab: str) -> None:
    with pw.Client(cluster, name="trainer") as client, browser_page() as page:
        a = client.allocate({"x": 2}, name="enc")
        b = client.allocate({"x": 2}, name="dec")
        try:
            page.goto(f"{lab}/lab", timeout=90_000)
            tab = page.locator("li.lm-TabBar-tab[data-id='pathways-nb-panel']")
            tab.wait_for(timeout=90_000)
            if not page.locator("#pathways-nb-panel").is_visible():
                tab.click()  # a second click would close it again
            status = page.locator(".pw-panel-status")
            status.locator("text=2 islands, 4 devices (4 in slices)").wait_for(timeout=60_000)
            assert cluster.scheduler_address in page.locator(".pw-panel-clusters").input_value()
            assert "trainer" in status.inner_text() and "JupyterLab" not in status.inner_text()
            _count(page, "#pathways-nb-panel .pw-panel-placement td.held", 4)

            enc = pw.jit(lambda v: jnp.tanh(v) * 2.0, slice=a, name="encode")
            dec = pw.jit(lambda v: v.sum(), slice=b, name="decode")
            x = a.put(np.ones((4, 4), np.float32), P("x"))
            for _ in range(3):
                float(dec(enc(x)))
            _count(page, "#pathways-nb-panel .pw-panel-timeline svg rect.program", 6)
            _count(page, "#pathways-nb-panel .pw-panel-timeline svg rect.transfer", 3)
            legend = page.locator("#pathways-nb-panel .pw-legend")
            assert legend.locator(".pw-legend-tenant").all_inner_texts() == [
                f"tenant {client.tenant} trainer"
            ]
            assert legend.locator(".pw-legend-transfer").count() == 1
            page.locator(
                "#pathways-nb-panel .pw-panel-placement td.held >> text=encode"
            ).first.wait_for()

            # The same board at the main area's width, in a tab of its own.
            page.click(".pw-panel-open-tab")
            tab = page.locator(".pw-timeline-tab")
            tab.locator(".pw-panel-timeline svg rect.program").first.wait_for(timeout=60_000)
            assert tab.locator(".pw-panel-placement td.held").count() == 4
            width = float(tab.locator(".pw-panel-timeline svg").get_attribute("width") or 0)
            assert width > 900  # drawn at the tab's width, wider than the sidebar

            b.release()
            _count(page, "#pathways-nb-panel .pw-panel-placement td.held", 2)
            status.locator("text=(2 in slices), 1 slices").wait_for(timeout=60_000)

            page.fill(".pw-panel-address", "tcp://127.0.0.1:1")
            page.press(".pw-panel-address", "Enter")
            page.locator(
                ".pw-panel-message.pw-panel-error >> text=cannot show the cluster at "
                "tcp://127.0.0.1:1"
            ).wait_for(timeout=60_000)
            page.select_option(".pw-panel-clusters", cluster.scheduler_address)
            page.wait_for_function(
                "!document.querySelector('.pw-panel-message').classList.contains('pw-panel-error')",
                timeout=60_000,
            )

            # JupyterLab opens the panel and the tab again when the page reloads.
            page.reload(timeout=90_000)
            _count(page, "#pathways-nb-panel .pw-panel-placement td.held", 2)
            _count(page, ".pw-timeline-tab .pw-panel-placement td.held", 2)
        finally:
            page.screenshot(path=str(ARTIFACTS / "lab-panel.png"), full_page=True)


def _api(lab: str, path: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{lab}/{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b"null")


def _refused(lab: str, path: str, method: str, body: Any = None) -> tuple[int, str]:
    try:
        _api(lab, path, method, body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]
    raise AssertionError(f"{method} {path} was not refused")


def test_the_server_refuses_clusters_it_cannot_start_or_did_not_start(lab: str) -> None:
    for body, word in [
        ({"islands": 0, "devices_per_island": 2}, "islands"),
        ({"islands": 1}, "devices_per_island"),
        ({"islands": 1, "devices_per_island": "2"}, "devices_per_island"),
        ([1, 2], "JSON object"),
        ({"islands": 1, "devices_per_island": 1, "platform": "gpu"}, "platform is 'cpu'"),
    ]:
        code, message = _refused(lab, "pathways-nb/clusters", "POST", body)
        assert code == 400 and word in message, message
    code, message = _refused(lab, "pathways-nb/clusters?address=tcp://127.0.0.1:1", "DELETE")
    assert code == 404 and "started no cluster at 'tcp://127.0.0.1:1'" in message


def test_the_panel_starts_a_cluster_a_notebook_uses_and_stops_it(lab: str) -> None:
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook = {"cells": [], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    _api(lab, "api/contents/connect.ipynb", "PUT", {"type": "notebook", "content": notebook})
    with browser_page() as page:
        try:
            page.goto(f"{lab}/lab/tree/connect.ipynb", timeout=90_000)
            page.locator(".jp-Notebook").wait_for(timeout=90_000)
            tab = page.locator("li.lm-TabBar-tab[data-id='pathways-nb-panel']")
            tab.wait_for(timeout=90_000)
            if not page.locator("#pathways-nb-panel").is_visible():
                tab.click()
            # A size the server refuses is said in the panel, and nothing starts.
            page.fill(".pw-panel-islands", "0")
            page.click(".pw-panel-start")
            page.locator(
                ".pw-panel-message.pw-panel-error >> text=islands is a whole number"
            ).wait_for(timeout=30_000)
            page.fill(".pw-panel-islands", "1")
            page.fill(".pw-panel-devices", "2")
            page.check(".pw-panel-tls")  # every link over TLS, on certificates made for it
            page.click(".pw-panel-start")
            status = page.locator(".pw-panel-status")
            status.locator("text=1 islands, 2 devices").wait_for(timeout=120_000)
            address = page.locator(".pw-panel-clusters").input_value()
            assert address.startswith("tls://")
            assert page.locator(".pw-panel-stop").is_visible()
            started = [c for c in _api(lab, "pathways-nb/clusters")["clusters"] if c["stoppable"]]
            assert [(c["address"], c["source"]) for c in started] == [(address, "started here")]
            pids = tree(started[0]["pid"])

            page.click(".pw-panel-insert")
            cell = page.locator(".jp-Notebook .jp-Cell .cm-content").last
            line = f'client = pw.Client("{address}", security=security)'
            cell.locator(f"text={line}").wait_for(timeout=30_000)
            assert "import pathways_nb as pw" in cell.inner_text()
            assert "tls_client_cert=" in cell.inner_text()
            # The cell the panel inserted, as the notebook would run it.
            code = _api(lab, f"pathways-nb/board?address={quote(address)}")["connect"]
            assert code.endswith(line)
            ran: dict[str, Any] = {}
            exec(code, ran)
            with ran["client"] as client:
                vs = client.allocate({"x": 2})
                x = np.arange(4, dtype=np.float32)
                np.testing.assert_array_equal(
                    pw.jit(lambda v: v + 1.0)(vs.put(x, P("x"))).fetch(), x + 1
                )
                status.locator("text=1 tenants").wait_for(timeout=60_000)

            page.click(".pw-panel-stop")
            page.locator(f".pw-panel-message >> text=stopped the cluster at {address}").wait_for(
                timeout=60_000
            )
            assert not page.locator(".pw-panel-stop").is_visible()
            # The panel waits for a choice; the address it showed is no longer offered.
            page.wait_for_function(
                "document.querySelector('.pw-panel-clusters').value === ''", timeout=30_000
            )
            offered = page.locator(".pw-panel-clusters option").all_inner_texts()
            assert offered[0] == "choose a cluster…" and not any(address in o for o in offered)
            assert not any(c["stoppable"] for c in _api(lab, "pathways-nb/clusters")["clusters"])
            assert gone(pids, 40), f"still running: {pids}"
        finally:
            page.screenshot(path=str(ARTIFACTS / "lab-panel-start.png"), full_page=True)
