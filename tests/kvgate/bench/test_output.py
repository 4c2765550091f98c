"""Where benchmark reports go: a written report always has its own run's figures beside it."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

from kvgate.bench.output import cpu_name, publish, source_commit


def test_a_full_run_writes_its_figures_beside_its_report(tmp_path: Path) -> None:
    default = tmp_path / "docs" / "bench.md"
    (tmp_path / "docs").mkdir()
    default.with_suffix(".json").write_text('{"stale": true}')  # an older run's figures
    publish(
        "# report\n", {"ratio": 1.5}, out=None, json_path=None, default_out=default, quick=False
    )
    assert default.read_text() == "# report\n"
    assert json.loads(default.with_suffix(".json").read_text()) == {"ratio": 1.5}


def test_a_quick_run_leaves_the_docs_alone_unless_told(tmp_path: Path) -> None:
    default = tmp_path / "bench.md"
    publish("# report\n", {"ratio": 1.5}, out=None, json_path=None, default_out=default, quick=True)
    assert not default.exists() and not default.with_suffix(".json").exists()
    chosen = tmp_path / "figures.json"
    publish(
        "# report\n", {"ratio": 2.0}, out=None, json_path=chosen, default_out=default, quick=True
    )
    assert json.loads(chosen.read_text()) == {"ratio": 2.0} and not default.exists()


def test_runs_record_the_commit_and_the_cpu_they_measured() -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    commit = source_commit()
    assert commit is not None and len(commit.removesuffix("-dirty")) == 12
    assert head.startswith(commit.removesuffix("-dirty"))
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert commit.endswith("-dirty") == bool(dirty)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    assert cpu_name() == (names[0] if names else platform.machine())
