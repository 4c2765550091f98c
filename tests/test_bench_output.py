"""Where benchmark reports go: a written report always has its own run's figures beside it."""

from __future__ import annotations

import json
from pathlib import Path

from kvgate.bench_output import publish


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
