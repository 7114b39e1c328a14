"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def _figure() -> tuple[Any, Any]:
    """A new figure and its axes, drawn without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 4.5))


def _save(fig: Any, ax: Any, path: str) -> str:
    import matplotlib.pyplot as plt

    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grouped_bars(
    path: str,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    log: bool = False,
) -> str:
    """One group of bars per entry of ``groups``, one bar per series in each."""
    fig, ax = _figure()
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    return _save(fig, ax, path)


def lines(
    path: str,
    title: str,
    xs: Sequence[float],
    series: dict[str, Sequence[dict[str, float]]],
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    hlines: dict[str, float] | None = None,
) -> str:
    """One line per series through the medians of ``summary()`` dicts, the min..max over
    repeats as error bars; a log x axis by default (cluster sizes grow geometrically);
    ``hlines`` draws dashed reference levels such as a target."""
    fig, ax = _figure()
    for name, stats in series.items():
        med = [s["median"] for s in stats]
        err = [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]
        ax.errorbar(list(xs), med, yerr=err, fmt="o-", capsize=3, label=name)
    for name, y in (hlines or {}).items():
        ax.axhline(y, color="grey", linestyle="--", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs), [f"{x:,.0f}" for x in xs])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, ax, path)
