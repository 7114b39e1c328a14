"""JupyterLab really draws the widgets: a real server, a real kernel, Debian's Chromium.

The notebook below runs programs on an in-process cluster inside the kernel, then shows
the dataflow-graph widget and the timeline widget. The browser must draw one SVG node
per graph node (bundled Graphviz, no network) and one bar per program and transfer in
the timeline. Screenshots are kept under ``tests/artifacts/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from _lab import ARTIFACTS, browser_page, lab_server

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CELLS = [
    "import os\n"
    "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'\n"
    "os.environ['JAX_PLATFORMS'] = 'cpu'\n"
    "import numpy as np, jax.numpy as jnp\n"
    "from jax.sharding import PartitionSpec as P\n"
    "import pathways_nb as pw\n"
    "cluster = pw.InProcessCluster(islands=2, devices_per_island=2)\n"
    "client = cluster.client()\n"
    "a = client.allocate({'x': 2}, name='enc')\n"
    "b = client.allocate({'x': 2}, name='dec')\n"
    "enc = pw.jit(lambda v: jnp.tanh(v) * 2, slice=a, name='encode')\n"
    "dec = pw.jit(lambda v: v.sum(), slice=b, name='decode')\n"
    "x = a.put(np.ones((4, 4), np.float32), P('x'))\n"
    "for _ in range(3):\n"
    "    float(dec(enc(x)))\n"
    "client.wait_all()",
    "g = pw.viz.GraphWidget(client.graph(lambda v: dec(enc(v)), x))\n"
    "print('graph nodes', g.nodes)\n"
    "g",
    "t = pw.viz.timeline(client, live=False)\nprint('timeline rows', len(t.rows))\nt",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("lab")
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": c,
                "outputs": [],
                "execution_count": None,
            }
            for c in CELLS
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "widgets.ipynb").write_text(json.dumps(nb))
    with lab_server(root, tmp_path_factory.mktemp("lab-log") / "server.log") as url:
        yield url


def test_jupyterlab_draws_the_graph_and_the_timeline(lab: str) -> None:
    with browser_page() as page:
        try:
            page.goto(f"{lab}/lab/tree/widgets.ipynb", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            page.wait_for_selector(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000
            )
            _run_all(page)
            page.wait_for_selector(".jp-OutputArea-output >> text=timeline rows", timeout=180_000)
            graph_nodes = _printed(page, "graph nodes")
            rows = _printed(page, "timeline rows")
            page.wait_for_function(
                f"document.querySelectorAll('.pw-graph svg g.node').length === {graph_nodes}",
                timeout=60_000,
            )
            page.wait_for_function(
                f"document.querySelectorAll('.pw-timeline svg rect').length === {rows}",
                timeout=60_000,
            )
            assert graph_nodes == 3 and rows == 9
            assert page.locator(".pw-graph svg g.edge").count() == 2
            assert page.locator(".pw-timeline svg rect.transfer").count() == 3
        finally:
            page.screenshot(path=str(ARTIFACTS / "lab-widgets.png"), full_page=True)


def _run_all(page: Any) -> None:
    """Run > Run All Cells, once the notebook has focus and the command is enabled; again
    if no cell started (the menu can open before the notebook is current)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(3):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.get_by_role("menuitem", name="Run").first.click()
        item = page.locator("li[data-command='runmenu:run-all']:not(.lm-mod-disabled)")
        item.wait_for(timeout=30_000)
        item.click()
        try:
            page.wait_for_function(
                "[...document.querySelectorAll('.jp-InputPrompt')]"
                ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))",
                timeout=15_000,
            )
            return
        except PlaywrightTimeout:  # the menu opened too early: open it again
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells did not start the notebook")


def _printed(page: object, label: str) -> int:
    """A number the notebook printed after ``label``."""
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()  # type: ignore[attr-defined]
    for text in texts:
        if label in text:
            return int(text.split(label)[1].split()[0])
    raise AssertionError(f"{label!r} not in the outputs: {texts}")
