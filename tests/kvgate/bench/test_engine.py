"""`kvgate bench engine`: the report's verdicts follow the figures, and a quick run writes them."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kvgate.bench.engine import Figures, engine, on_own_thread, render, with_history
from kvgate.bench.engine_figures import bandwidth_of


def figures(
    prefill: dict[int, tuple[float, float]],
    decode: dict[int, float],
    hf: dict[int, float],
    floor_tps: float = 20.0,
) -> Figures:
    """Figures of a run: ``prefill`` maps a prompt length to (ours, transformers') tok/s;
    the bandwidth and bytes per step give ``floor_tps`` at batch 1."""
    return Figures(
        model="m",
        machine="cpu",
        threads=2,
        matmul_gflops=100.0,
        prefill_tps={n: ours for n, (ours, _) in prefill.items()},
        prefill_gflops={n: ours / 10 for n, (ours, _) in prefill.items()},
        hf_prefill_tps={n: theirs for n, (_, theirs) in prefill.items()},
        decode_tps=decode,
        hf_decode_tps=hf,
        bandwidth_gbs=10.0,
        decode_bytes=int(10e9 / floor_tps),
    )


def test_targets_are_judged_on_the_measured_figures() -> None:
    good = figures(
        {512: (600.0, 590.0), 4096: (500.0, 480.0)},
        {1: 19.0, 8: 60.0, 32: 160.0},
        {1: 3.0, 8: 40.0},
    )
    assert [m for _, m, _ in good.targets()] == [True] * 6
    bad = figures(
        {512: (580.0, 590.0), 4096: (400.0, 480.0)},
        {1: 17.0, 8: 59.0, 32: 130.0},
        {1: 3.0, 8: 40.0},
    )
    verdicts = bad.targets()
    assert [m for _, m, _ in verdicts] == [False] * 6
    assert verdicts[0][2] == "40.0 of 100.0 GFLOP/s = 40%"
    assert verdicts[2] == (
        "prefill at 4096 tokens >= 1.0x transformers",
        False,
        "400.0 / 480.0 tok/s = 0.83x",
    )
    assert verdicts[3] == (
        "batch-1 decode >= 90% of the memory-bandwidth floor",
        False,
        "17.0 of 20.0 tok/s = 85%",
    )
    report = render(bad)
    assert "**missed**: batch-32 decode >= 8x batch-1 decode (130.0 / 17.0 tok/s = 7.6x)" in report
    assert "at 10.0 GB/s" in report
    ratios = bad.ratios()
    assert ratios["prefill_vs_transformers"] == {512: 580.0 / 590.0, 4096: 400.0 / 480.0}
    assert ratios["decode_vs_transformers"] == {1: 17.0 / 3.0, 8: 59.0 / 40.0}
    assert ratios["decode_batch32_vs_batch1"] == 130.0 / 17.0
    assert abs(ratios["decode_batch1_vs_bandwidth_floor"] - 0.85) < 1e-6
    assert "decode_batch1_vs_read_floor" not in ratios  # no read-only bandwidth measured


def test_the_read_only_bandwidth_gives_the_floor_of_a_step_that_only_reads() -> None:
    """Reading at 8 GB/s against a copy's 10, the same bytes allow 16 tok/s, not 20: decode
    at 17 tok/s misses the copy's floor and is above the read-only one, and both are said."""
    run = replace(
        figures({128: (1.0, 1.0)}, {1: 17.0, 32: 130.0}, {1: 3.0}),
        read_bandwidth_gbs=bandwidth_of([8.0, 7.0, 9.0]),
        read_bandwidth_samples=[8.0, 7.0, 9.0],
    )
    assert abs(run.read_floor_tps - 16.0) < 1e-6
    assert abs(run.ratios()["decode_batch1_vs_read_floor"] - 17.0 / 16.0) < 1e-6
    report = render(run)
    assert "3 freshly allocated buffers, which gave 7.0 to 9.0): **8.0 GB/s**" in report
    assert "Read at the read-only rate, 8.0 GB/s, the same bytes take a step of 62.5 ms, 16.0 tok/s: batch-1 decode is 106% of that." in report  # fmt: skip


def test_the_bandwidth_is_what_a_typical_allocation_gets() -> None:
    """One lucky buffer (here 68 GB/s among 37-41) moves neither the floor nor the report's
    bandwidth; the report shows the spread of the samples."""
    samples = [38.0, 68.0, 41.0, 37.0, 40.0]
    assert bandwidth_of(samples) == 40.0
    assert bandwidth_of([]) == 0.0
    run = replace(
        figures({128: (1.0, 1.0)}, {1: 10.0}, {1: 3.0}),
        bandwidth_gbs=bandwidth_of(samples),
        bandwidth_samples=samples,
    )
    assert "5 freshly allocated buffers, which gave 37.0 to 68.0): **40.0 GB/s**" in render(run)


def test_the_report_names_the_device_and_the_commit_measured() -> None:
    cpu = replace(
        figures({128: (1.0, 1.0)}, {1: 10.0}, {1: 3.0}), engine="float32 on cpu, KV in float16"
    )
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


def test_the_report_points_to_the_hand_written_history_when_there_is_one(tmp_path: Path) -> None:
    out = tmp_path / "engine.md"
    assert with_history("# figures\n", out) == "# figures\n"
    (tmp_path / "engine_history.md").write_text("## a profile\n")
    linked = with_history("# figures\n", out)
    assert linked.startswith("# figures\n") and "[engine_history.md](engine_history.md)" in linked


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
    # tiny-random's context (4096 tokens) leaves no room after a 4096-token prompt
    assert set(figures["prefill_tps"]) == {"128", "512", "2048"}
    assert set(figures["decode_tps"]) == {"1", "8", "32"}
    assert set(figures["hf_prefill_tps"]) == {"128", "512", "2048"}
    assert set(figures["hf_decode_tps"]) == {"1", "8"}
    assert figures["matmul_gflops"] == max(figures["matmul_samples"]) > 0
    assert len(figures["bandwidth_samples"]) == 8  # two fresh buffers at each of 4 samples
    assert figures["bandwidth_gbs"] == statistics.median(figures["bandwidth_samples"]) > 0
    assert len(figures["read_bandwidth_samples"]) == 8
    assert figures["read_bandwidth_gbs"] == statistics.median(figures["read_bandwidth_samples"]) > 0
    assert figures["ratios"]["decode_batch1_vs_read_floor"] > 0
    assert set(figures["ratios"]["prefill_vs_transformers"]) == {"128", "512", "2048"}
    assert figures["ratios"]["decode_batch1_vs_bandwidth_floor"] > 0
    assert len(figures["json_pairs"]) == 9
    assert figures["json_decode_tps"] == max(held for _, held in figures["json_pairs"])
    assert len(figures["targets"]) == 8
    report = out.read_text()
    assert "## Targets" in report and report in result.output
    # float32 on a CPU with oneDNN: the kernel one row took was timed, and the report says so
    if torch.backends.mkldnn.is_available():
        assert figures["single_row"].startswith("one row: ")
        assert figures["single_row"] in report


def test_the_grammar_cost_is_the_median_pair() -> None:
    """The JSON-schema verdict takes the median of the back-to-back pairs' ratios, so one
    disturbed run (here a free run twice as fast) does not decide it."""
    run = replace(
        figures({128: (1.0, 1.0)}, {1: 10.0, 8: 200.0}, {}),
        json_pairs=[(100.0, 95.0), (200.0, 96.0), (100.0, 97.0)],
        json_decode_tps=97.0,
    )
    assert run.ratios()["json_decode_vs_free"] == 0.95
    verdict = run.targets()[-1]
    assert verdict == (
        "batch-8 decode with a JSON schema costs <= 10%",
        True,
        "median of 3 back-to-back pairs: 5.0% slower",
    )
    slow = replace(run, json_pairs=[(100.0, 85.0), (100.0, 95.0), (100.0, 80.0)])
    assert slow.targets()[-1][1] is False
    assert "100.0 / 85.0, 100.0 / 95.0, 100.0 / 80.0" in render(slow)
