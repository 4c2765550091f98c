"""Where a benchmark's report and figures go: stdout, a Markdown file, a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


def publish(
    report: str,
    figures: dict[str, Any],
    *,
    out: Path | None,
    json_path: Path | None,
    default_out: Path,
    quick: bool,
) -> None:
    """Print ``report``; write it to ``out`` (``default_out`` on a full run when unset) and
    ``figures`` to ``json_path``, or, when that is not given, beside the written report
    (same name, ``.json``), so that a report in the docs has its own run's figures next to
    it. A quick run never overwrites the docs by default."""
    click.echo(report)
    if out is None and not quick:
        out = default_out
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        click.echo(f"wrote {out}", err=True)
        json_path = json_path or out.with_suffix(".json")
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2))
        click.echo(f"wrote {json_path}", err=True)
