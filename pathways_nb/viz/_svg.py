"""Static SVG drawings, for notebooks rendered without a widget manager."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

# Tenant colours (a colour-blind-safe qualitative palette); transfers are hatched grey.
PALETTE = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"]

_LANE_H, _BAR_H, _LEFT, _WIDTH = 26, 16, 140, 760


def timeline_svg(rows: Sequence[dict[str, Any]], lanes: Sequence[str]) -> str:
    """One lane per slice; a bar per program or transfer; a line for its queueing."""
    if not rows:
        return "<p><i>no programs in this window</i></p>"
    t0 = min(r["launch"] for r in rows)
    t1 = max((r["end"] if r["end"] is not None else r["start"]) for r in rows)
    span = max(t1 - t0, 1e-3)
    x = lambda t: _LEFT + (t - t0) / span * (_WIDTH - _LEFT - 10)  # noqa: E731
    height = _LANE_H * len(lanes) + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    index = {lane: i for i, lane in enumerate(lanes)}
    for name, i in index.items():
        y = 10 + i * _LANE_H
        out.append(f'<text x="4" y="{y + 12}">{html.escape(name)}</text>')
        out.append(
            f'<line x1="{_LEFT}" x2="{_WIDTH - 10}" y1="{y + _LANE_H - 4}" '
            f'y2="{y + _LANE_H - 4}" stroke="#eee"/>'
        )
    for r in rows:
        row = index.get(r["lane"])
        if row is None:
            continue
        y = 10 + row * _LANE_H
        end = r["end"] if r["end"] is not None else t1
        colour = "#999" if r["kind"] == "transfer" else PALETTE[r["tenant"] % len(PALETTE)]
        if r["start"] > r["launch"]:
            out.append(
                f'<line class="queued" x1="{x(r["launch"]):.1f}" x2="{x(r["start"]):.1f}" '
                f'y1="{y + _BAR_H / 2}" y2="{y + _BAR_H / 2}" stroke="{colour}" '
                'stroke-dasharray="2,2" stroke-width="1"/>'
            )
        title = f"{r['name']} ({r['kind']}, tenant {r['tenant']}): {end - r['start']:.2f} ms"
        out.append(
            f'<rect class="{r["kind"]}" x="{x(r["start"]):.1f}" y="{y}" '
            f'width="{max(1.0, x(end) - x(r["start"])):.1f}" height="{_BAR_H}" fill="{colour}" '
            f'stroke="{"#c00" if r["failed"] else "none"}"><title>{html.escape(title)}</title>'
            "</rect>"
        )
    out.append(
        f'<text x="{_LEFT}" y="{height - 6}">0 ms</text>'
        f'<text x="{_WIDTH - 60}" y="{height - 6}">{span:.1f} ms</text></svg>'
    )
    return "".join(out)
