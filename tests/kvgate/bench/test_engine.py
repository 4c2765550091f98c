"""`kvgate bench engine`: the report's verdicts follow the figures, and a quick run writes them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kvgate.bench.engine import Figures, engine, on_own_thread, render


def figures(prefill_2048_gflops: float, decode: dict[int, float], hf: dict[int, float]) -> Figures:
    return Figures(
        model="m",
        machine="cpu",
        threads=2,
        matmul_gflops=100.0,
        prefill_tps={2048: 1000.0},
        prefill_gflops={2048: prefill_2048_gflops},
        decode_tps=decode,
        hf_decode_tps=hf,
    )


def test_targets_are_judged_on_the_measured_figures() -> None:
    met = figures(60.0, {1: 10.0, 8: 60.0, 32: 90.0}, {1: 3.0, 8: 20.0}).targets()
    assert [m for _, m, _ in met] == [True, True, True, True]
    missed = figures(40.0, {1: 10.0, 8: 50.0, 32: 70.0}, {1: 4.0, 8: 20.0}).targets()
    assert [m for _, m, _ in missed] == [False, False, False, False]
    assert missed[0][2] == "40.0 of 100.0 GFLOP/s = 40%"
    assert "**missed**: batch-32 decode >= 8x batch-1 decode (70.0 / 10.0 tok/s = 7.0x)" in render(
        figures(40.0, {1: 10.0, 8: 50.0, 32: 70.0}, {1: 4.0, 8: 20.0})
    )


def test_the_report_names_the_device_and_the_commit_measured() -> None:
    cpu = replace(figures(60.0, {1: 10.0}, {1: 3.0}), engine="float32 on cpu, KV in float16")
    assert render(cpu).startswith("# Built-in engine benchmark\n")
    assert "Written by `kvgate bench engine`;" in render(cpu)
    gpu = replace(cpu, engine="bfloat16 on cuda", commit="0123456789ab")
    assert render(gpu).startswith("# Built-in engine benchmark on a GPU (bfloat16 on cuda)\n")
    assert "Written by `kvgate bench engine` on commit `0123456789ab`;" in render(gpu)


def test_a_yardstick_runs_on_a_thread_of_its_own_with_the_cores() -> None:
    """The yardsticks get the engine's thread count on a thread that then ends; the caller
    keeps its count, and a yardstick's error reaches the caller."""
    before = torch.get_num_threads()
    assert on_own_thread(torch.get_num_threads, before + 2) == before + 2
    assert torch.get_num_threads() == before

    def broken() -> None:
        raise ValueError("no roofline")

    with pytest.raises(ValueError, match="no roofline"):
        on_own_thread(broken, 1)


@pytest.mark.slow
def test_quick_run_writes_every_figure(
    tmp_path: Path, smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tiny-random borrows SmolLM2's tokenizer from the models dir under KVGATE_HOME.
    monkeypatch.setenv("KVGATE_HOME", str(smollm2_gguf.parent.parent))
    out, data = tmp_path / "engine.md", tmp_path / "engine.json"
    threads = torch.get_num_threads()
    result = CliRunner().invoke(
        engine, ["--model", "tiny-random", "--quick", "--out", str(out), "--json", str(data)]
    )
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads  # the run gave the caller its count back
    figures = json.loads(data.read_text())
    assert figures["threads"] == threads  # the engine's thread had them all
    assert set(figures["prefill_tps"]) == {"128", "512", "2048"}
    assert set(figures["decode_tps"]) == {"1", "8", "32"}
    assert set(figures["hf_prefill_tps"]) == {"128", "512", "2048"}
    assert set(figures["hf_decode_tps"]) == {"1", "8"}
    assert figures["matmul_gflops"] == max(figures["matmul_samples"]) > 0
    assert len(figures["targets"]) == 4
    report = out.read_text()
    assert "## Targets" in report and report in result.output
