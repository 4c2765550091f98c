"""The measured figures shown on the landing page, read from ``kvgate bench`` output.

Each benchmark writes ``docs/benchmarks/<name>.md`` (a title and tables) and sometimes
``<name>.json`` (flat figures). The landing page shows, per benchmark, the Markdown's title
and first table; a benchmark with only JSON shows its numeric figures. Nothing is invented:
with no files there is no figures section.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Benchmark:
    """One benchmark's headline table."""

    name: str
    title: str
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    return [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]


def from_markdown(name: str, text: str) -> Benchmark | None:
    """The title and first table of a benchmark report; None when it has no table."""
    lines = text.splitlines()
    title = next((ln[2:].strip() for ln in lines if ln.startswith("# ")), name)
    table: list[list[str]] = []
    for line in lines:
        if line.lstrip().startswith("|"):
            table.append(_cells(line))
        elif table:
            break
    # row 1 is the |---| separator line
    if len(table) < 3:
        return None
    return Benchmark(name, title, table[0], table[2:])


def from_json(name: str, text: str) -> Benchmark | None:
    """Flat numeric figures of a JSON benchmark result; None when there are none."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    rows = [
        [key, f"{value:,.3g}" if isinstance(value, float) else f"{value:,}"]
        for key, value in data.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    return Benchmark(name, name, ["figure", "measured"], rows) if rows else None


def load(directory: Path | None) -> list[Benchmark]:
    """Every benchmark found in ``directory`` (Markdown preferred over JSON), by name."""
    if directory is None or not directory.is_dir():
        return []
    found: dict[str, Benchmark] = {}
    for path in sorted(directory.glob("*.json")):
        bench = from_json(path.stem, path.read_text(errors="replace"))
        if bench is not None:
            found[path.stem] = bench
    for path in sorted(directory.glob("*.md")):
        bench = from_markdown(path.stem, path.read_text(errors="replace"))
        if bench is not None:
            found[path.stem] = bench
    return [found[name] for name in sorted(found)]
