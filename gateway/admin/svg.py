"""Line charts over time as inline SVG, drawn on the server (no script, CSP-safe).

Companion of ``gateway.web.charts`` (bars per day): this one draws lines over arbitrary
timestamps, for the tier figures sampled every minute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

_W, _H = 640, 220
_LEFT, _RIGHT, _BOTTOM, _TOP = 64, 16, 28, 12


@dataclass(frozen=True)
class Line:
    """One line: a legend label, a CSS class (its colour) and a value per time (None: gap)."""

    label: str
    css: str
    values: list[float | None]


def line_chart(
    title: str, times: list[datetime], lines: list[Line], fmt: Callable[[float], str]
) -> Markup:
    """An SVG with one polyline per ``lines`` over ``times``, a y scale and a legend."""
    known = [v for line in lines for v in line.values if v is not None]
    top = max([*known, 0.0]) or 1.0
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _BOTTOM - _TOP
    first = times[0].timestamp() if times else 0.0
    span = (times[-1].timestamp() - first) if len(times) > 1 else 1.0
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H + 24}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for frac in (0, 0.5, 1):
        y = _TOP + plot_h * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(fmt(top * frac))}</text>"
        )
    for when in times[:: max(1, len(times) // 5)]:
        x = _LEFT + plot_w * (when.timestamp() - first) / (span or 1.0)
        parts.append(
            f'<text class="axis" x="{x:.1f}" y="{_H - 8}" text-anchor="middle">'
            f"{when.strftime('%H:%M')}</text>"
        )
    for line in lines:
        points = [
            f"{_LEFT + plot_w * (t.timestamp() - first) / (span or 1.0):.1f},"
            f"{_TOP + plot_h * (1 - v / top):.1f}"
            for t, v in zip(times, line.values, strict=True)
            if v is not None
        ]
        if points:
            parts.append(
                f'<polyline class="line {escape(line.css)}" points="{" ".join(points)}">'
                f"<title>{escape(line.label)}</title></polyline>"
            )
    x = _LEFT
    for line in lines:
        parts.append(
            f'<rect class="{escape(line.css)}" x="{x}" y="{_H + 8}" width="10" height="10"/>'
            f'<text class="legend" x="{x + 14}" y="{_H + 17}">{escape(line.label)}</text>'
        )
        x += 24 + 7 * len(line.label)
    parts.append("</svg>")
    return Markup("".join(parts))
