"""Charts as inline SVG, drawn on the server: no chart library, no CDN, no script (CSP-safe).

Two kinds share one frame (title, y scale with grid lines, legend): stacked bars per day
(the console's and admin's usage) and lines over arbitrary timestamps (the tier figures
sampled every minute). A third, labelled horizontal bars, compares a few figures (the
landing page's time to first token per tier). The SVG scales with its container (``viewBox`` plus
``width: 100%`` in CSS), so the same chart fits a phone and a desktop. Every text in it
goes through Markup escaping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime

from markupsafe import Markup, escape

_W, _H = 640, 220
_BOTTOM, _TOP = 28, 12
_PLOT_H = _H - _BOTTOM - _TOP


@dataclass(frozen=True)
class Series:
    """One stacked layer: a legend label, a CSS class (its colour) and a value per day."""

    label: str
    css: str
    values: list[int]


@dataclass(frozen=True)
class Line:
    """One line: a legend label, a CSS class (its colour) and a value per time (None: gap)."""

    label: str
    css: str
    values: list[float | None]


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def _open(title: str, top: float, fmt: Callable[[float], str], left: int, right: int) -> list[str]:
    """The SVG's opening, its title and the y scale (grid lines at 0, half and ``top``)."""
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H + 24}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for frac in (0, 0.5, 1):
        y = _TOP + _PLOT_H * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{left}" x2="{_W - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(fmt(top * frac))}</text>"
        )
    return parts


def _close(
    parts: list[str], legend: list[Series] | list[Line], left: int, gap: int, per_char: int
) -> Markup:
    """``parts`` with a legend (a swatch and label per entry) and the closing tag."""
    x = left
    for entry in legend:
        parts.append(
            f'<rect class="{escape(entry.css)}" x="{x}" y="{_H + 8}" width="10" height="10"/>'
            f'<text class="legend" x="{x + 14}" y="{_H + 17}">{escape(entry.label)}</text>'
        )
        x += gap + per_char * len(entry.label)
    parts.append("</svg>")
    return Markup("".join(parts))


def stacked_bars(title: str, days: list[date], series: list[Series]) -> Markup:
    """An SVG of one bar per day, ``series`` stacked bottom-up, with a y scale and legend."""
    left, right = 56, 28
    totals = [sum(s.values[i] for s in series) for i in range(len(days))]
    top = max([*totals, 1])
    step = (_W - left - right) / max(len(days), 1)
    parts = _open(title, top, _short, left, right)
    for i, day in enumerate(days):
        x = left + i * step + step * 0.15
        base = _TOP + _PLOT_H
        for s in series:
            h = _PLOT_H * s.values[i] / top
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
    return _close(parts, series, left, gap=20, per_char=8)


def line_chart(
    title: str, times: list[datetime], lines: list[Line], fmt: Callable[[float], str]
) -> Markup:
    """An SVG with one polyline per ``lines`` over ``times``, a y scale and a legend."""
    left, right = 64, 16
    known = [v for line in lines for v in line.values if v is not None]
    top = max([*known, 0.0]) or 1.0
    plot_w = _W - left - right
    first = times[0].timestamp() if times else 0.0
    span = (times[-1].timestamp() - first) if len(times) > 1 else 1.0
    parts = _open(title, top, fmt, left, right)
    for when in times[:: max(1, len(times) // 5)]:
        x = left + plot_w * (when.timestamp() - first) / (span or 1.0)
        parts.append(
            f'<text class="axis" x="{x:.1f}" y="{_H - 8}" text-anchor="middle">'
            f"{when.strftime('%H:%M')}</text>"
        )
    for line in lines:
        points = [
            f"{left + plot_w * (t.timestamp() - first) / (span or 1.0):.1f},"
            f"{_TOP + _PLOT_H * (1 - v / top):.1f}"
            for t, v in zip(times, line.values, strict=True)
            if v is not None
        ]
        if points:
            parts.append(
                f'<polyline class="line {escape(line.css)}" points="{" ".join(points)}">'
                f"<title>{escape(line.label)}</title></polyline>"
            )
    return _close(parts, lines, left, gap=24, per_char=7)


@dataclass(frozen=True)
class Bar:
    """One horizontal bar: a label above it, a CSS class (its colour), a value and the text
    printed after the bar (the value as a reader wants it)."""

    label: str
    css: str
    value: float
    text: str


_HBAR_W, _ROW = 360, 44


def hbars(title: str, bars: list[Bar]) -> Markup:
    """An SVG of one labelled horizontal bar per entry, all on one linear scale from 0.

    Narrower than the other charts (360 units, about a phone's width), so that on a 390 px
    phone its text is drawn near its CSS size; each bar carries its value in ``data-value``
    for tests and scripts.
    """
    top = max([b.value for b in bars if b.value > 0] or [1.0])
    room = _HBAR_W - 70  # the value's text goes right of the longest bar
    height = _ROW * len(bars) + 8
    parts = [
        f'<svg class="chart hbars" viewBox="0 0 {_HBAR_W} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for i, bar in enumerate(bars):
        y = i * _ROW
        width = max(room * bar.value / top, 2.0)
        parts.append(
            f'<text class="label" x="0" y="{y + 14}">{escape(bar.label)}</text>'
            f'<rect class="{escape(bar.css)}" x="0" y="{y + 20}" width="{width:.1f}" '
            f'height="16" data-value="{bar.value!r}"><title>{escape(bar.label)}: '
            f"{escape(bar.text)}</title></rect>"
            f'<text class="value" x="{width + 6:.1f}" y="{y + 33}">{escape(bar.text)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
