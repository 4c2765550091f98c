"""Bar charts as inline SVG, drawn on the server: no chart library, no CDN, no script.

The SVG scales with its container (``viewBox`` plus ``width: 100%`` in CSS), so the same
chart fits a phone and a desktop. Every text in it goes through Markup escaping.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from markupsafe import Markup, escape

_W, _H = 640, 220
_LEFT, _RIGHT, _BOTTOM, _TOP = 56, 28, 28, 12


@dataclass(frozen=True)
class Series:
    """One stacked layer: a legend label, a CSS class (its colour) and a value per day."""

    label: str
    css: str
    values: list[int]


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def stacked_bars(title: str, days: list[date], series: list[Series]) -> Markup:
    """An SVG of one bar per day, ``series`` stacked bottom-up, with a y scale and legend."""
    totals = [sum(s.values[i] for s in series) for i in range(len(days))]
    top = max([*totals, 1])
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _BOTTOM - _TOP
    step = plot_w / max(len(days), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H + 24}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for frac in (0, 0.5, 1):
        y = _TOP + plot_h * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_short(top * frac)}</text>"
        )
    for i, day in enumerate(days):
        x = _LEFT + i * step + step * 0.15
        base = _TOP + plot_h
        for s in series:
            h = plot_h * s.values[i] / top
            if h > 0:
                base -= h
                parts.append(
                    f'<rect class="{escape(s.css)}" x="{x:.1f}" y="{base:.1f}" '
                    f'width="{step * 0.7:.1f}" height="{h:.1f}"><title>{escape(s.label)} '
                    f"{day.isoformat()}: {s.values[i]}</title></rect>"
                )
        if i % max(1, len(days) // 6) == 0 or i == len(days) - 1:
            parts.append(
                f'<text class="axis" x="{x + step * 0.35:.1f}" y="{_H - 10}" '
                f'text-anchor="middle">{day.strftime("%b %d")}</text>'
            )
    x = _LEFT
    for s in series:
        parts.append(
            f'<rect class="{escape(s.css)}" x="{x}" y="{_H + 8}" width="10" height="10"/>'
            f'<text class="legend" x="{x + 14}" y="{_H + 17}">{escape(s.label)}</text>'
        )
        x += 20 + 8 * len(s.label)
    parts.append("</svg>")
    return Markup("".join(parts))
