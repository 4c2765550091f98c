"""``scripts/gpu-check.sh --dry-run``: what CI runs of the GPU script, so that it cannot rot.

Every step's command line must still parse, the CUDA tests must still collect, and the
conversation check (second turn cached from our tiers after a flush) must pass on the
built-in worker with the tiny random model; where SGLang imports, SGLang's own parser
must accept the launch the GPU run makes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kvgate.cli import cli
from tests.support.commands import kvgate_env

REPO = Path(__file__).resolve().parents[2]


def test_the_dry_run_checks_every_step_and_plays_the_tiers_check_on_the_cpu(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    tokenizer = tmp_path / "tokenizer"
    exported = CliRunner().invoke(cli, ["models", "export-tokenizer", str(smollm2_gguf), str(tokenizer)])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    out = tmp_path / "out"
    env = kvgate_env(
        smollm2_gguf.parent.parent,
        KVGATE_WORKER_MODEL="tiny-random",
        KVGATE_WORKER_TOKENIZER=str(tokenizer),
        OUT=str(out),
        PYTHON=sys.executable,
    )
    run = subprocess.run(
        ["bash", "scripts/gpu-check.sh", "--dry-run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    log = (out / "log.txt").read_text()
    for step in ("collect cuda tests", "bench engine (options)", "bench multiturn (options)",
                 "tiers check (built-in worker)"):  # fmt: skip
        assert f"=== {step}: exit 0" in log
    figures = json.loads((out / "builtin_tiers.json").read_text())
    assert figures["ok"] is True
    assert figures["second_cached_from_tiers"] >= figures["first_prompt_tokens"] // 2
    assert figures["nas_blocks_after_first_turn"] > 0
