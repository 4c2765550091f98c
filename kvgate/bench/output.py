"""Where a benchmark's report and figures go (stdout, a Markdown file, a JSON file), and
what every report says of where its figures come from: the CPU and the code."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import click

#: the checkout the benchmarks run from (``kvgate/`` is one level down)
_REPO = Path(__file__).resolve().parents[2]


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else the architecture. Figures move
    several-fold between CPUs of one architecture (fp32 matmuls on two 2-core x86_64 VMs:
    351 and 74 GFLOP/s), so a report without it cannot be compared with another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def source_commit() -> str | None:
    """The git commit of the code being measured (``-dirty`` when tracked files differ from
    it), or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_REPO), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


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
