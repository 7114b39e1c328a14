"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

import os
from collections.abc import Sequence


def grouped_bars(
    path: str,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    log: bool = False,
) -> str:
    """One group of bars per entry of ``groups``, one bar per series in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
