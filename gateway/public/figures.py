"""Every benchmark report in full, for the /benchmarks page, read from ``kvgate bench`` output.

Each benchmark writes ``docs/benchmarks/<name>.md`` (a title, the conditions, tables) and
often ``<name>.json`` (the figures). The page shows each Markdown report rendered as HTML
(markdown-it, raw HTML off: a report cannot inject markup), its headings moved one level
down under the page's own and every table in a horizontally scrolling box, so a wide table
never widens a phone's viewport. A benchmark with only JSON shows its numeric figures as a
table. Nothing is invented: with no files there is nothing to show.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from markupsafe import Markup

_MD = MarkdownIt("commonmark", {"html": False}).enable("table")
_HEADING = re.compile(r"<(/?)h([1-5])>")


@dataclass(frozen=True)
class Report:
    """One benchmark's report as HTML."""

    name: str
    title: str
    html: Markup


def _html(markdown: str) -> Markup:
    html = _MD.render(markdown)
    html = _HEADING.sub(lambda m: f"<{m[1]}h{int(m[2]) + 1}>", html)
    # scroll boxes take the keyboard focus, so they can be scrolled without a mouse
    html = html.replace("<table>", '<div class="scroll" tabindex="0"><table>')
    html = html.replace("<pre>", '<pre tabindex="0">')
    return Markup(html.replace("</table>", "</table></div>"))


def from_markdown(name: str, text: str) -> Report:
    """A report's Markdown as HTML, titled by its first ``# `` line (else by ``name``,
    ``multiturn_quick`` read as "Multiturn quick")."""
    lines = text.splitlines()
    fallback = name.replace("_", " ").capitalize()
    title = next((ln[2:].strip() for ln in lines if ln.startswith("# ")), fallback)
    body = "\n".join(ln for ln in lines if not ln.startswith("# "))
    return Report(name, title, _html(body))


def from_json(name: str, text: str) -> Report | None:
    """The flat numeric figures of a JSON result as a table; None when there are none."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    rows = [
        f"| {key.replace('|', '/')} | {value:,.3g} |"
        if isinstance(value, float)
        else f"| {key.replace('|', '/')} | {value:,} |"
        for key, value in data.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    if not rows:
        return None
    return Report(name, name, _html("\n".join(["| figure | measured |", "|---|---|", *rows])))


def load(directory: Path | None) -> list[Report]:
    """Every report found in ``directory`` (Markdown preferred over JSON), by name."""
    if directory is None or not directory.is_dir():
        return []
    found: dict[str, Report] = {}
    for path in sorted(directory.glob("*.json")):
        report = from_json(path.stem, path.read_text(errors="replace"))
        if report is not None:
            found[path.stem] = report
    for path in sorted(directory.glob("*.md")):
        found[path.stem] = from_markdown(path.stem, path.read_text(errors="replace"))
    return [found[name] for name in sorted(found)]
