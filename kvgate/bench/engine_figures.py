"""What `kvgate bench engine` measured, the ratios and targets judged on it, and its report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

#: prompt lengths of the prefill comparison
PROMPT_LENGTHS = (128, 512, 2048, 4096)
DECODE_BATCHES = (1, 8, 32)
#: batch sizes at which transformers is run for the decode comparison
HF_DECODE_BATCHES = (1, 8)
#: prompt length of every decode-benchmark request
DECODE_PROMPT = 64
#: batch at which decode is measured with a JSON schema on every request too
JSON_BATCH = 8


@dataclass
class Figures:
    """Everything one run measured; tokens/s keyed by prompt length or batch size."""

    model: str
    machine: str
    threads: int
    matmul_gflops: float
    #: dtype and device the engine ran in, e.g. ``float32 on cpu``
    engine: str = "float32 on cpu"
    #: which kernel took one row through the weights, timed as the engine loaded
    #: (:class:`~workers.engine.projection.SingleRowChoice`); empty where there was no choice
    single_row: str = ""
    prefill_tps: dict[int, float] = field(default_factory=dict)
    prefill_gflops: dict[int, float] = field(default_factory=dict)
    decode_tps: dict[int, float] = field(default_factory=dict)
    hf_prefill_tps: dict[int, float] = field(default_factory=dict)
    hf_decode_tps: dict[int, float] = field(default_factory=dict)
    #: decode tokens/s at ``JSON_BATCH`` with every request held to a JSON schema (best run)
    json_decode_tps: float = 0.0
    #: (free, JSON schema) decode tokens/s at ``JSON_BATCH``, each pair measured back to back
    json_pairs: list[tuple[float, float]] = field(default_factory=list)
    decode_steps: int = 0
    #: repetitions of each measurement (each figure is the best of them)
    reps: int = 1
    #: every roofline sample (GFLOP/s); ``matmul_gflops`` is the best
    matmul_samples: list[float] = field(default_factory=list)
    #: memory bandwidth (GB/s, a copy's bytes read plus written), the median of
    #: ``bandwidth_samples``: each sample copies a freshly allocated buffer (best of a few
    #: copies), and on a virtual machine the memory an allocation lands in decides its rate
    #: (see :func:`bandwidth_of`)
    bandwidth_gbs: float = 0.0
    bandwidth_samples: list[float] = field(default_factory=list)
    #: read-only bandwidth (GB/s, a sum's bytes read), the median of its samples, each on
    #: a freshly allocated buffer as the copy's: what a pass that only reads gets
    read_bandwidth_gbs: float = 0.0
    read_bandwidth_samples: list[float] = field(default_factory=list)
    #: bytes a batch-1 decode step reads at best: every weight and the context's KV once
    decode_bytes: int = 0
    #: 1-minute load average at the start and the end: above the CPU count, other processes
    #: competed for the cores and every figure is a lower bound
    load_average: tuple[float, float] = (0.0, 0.0)
    #: the 1-minute load average at each yardstick sample, through the run
    load_samples: list[float] = field(default_factory=list)
    #: the git commit measured (see :func:`~kvgate.bench.output.source_commit`)
    commit: str | None = None

    @property
    def json_vs_free(self) -> float:
        """Median over :attr:`json_pairs` of JSON-schema over free decode tokens/s: each pair
        ran under the same load, so the ratio holds where the best of either would not (on a
        shared machine a free run alone varies by 30%)."""
        return statistics.median(held / free for free, held in self.json_pairs)

    @property
    def floor_tps(self) -> float:
        """Batch-1 decode tokens/s if a step cost only reading its bytes at the bandwidth."""
        return self.bandwidth_gbs * 1e9 / self.decode_bytes if self.decode_bytes else 0.0

    @property
    def read_floor_tps(self) -> float:
        """Batch-1 decode tokens/s if a step cost only reading its bytes at the read-only
        bandwidth: the bound for a step that only reads, where the copy's may be above it."""
        return self.read_bandwidth_gbs * 1e9 / self.decode_bytes if self.decode_bytes else 0.0

    def ratios(self) -> dict[str, Any]:
        """Every comparison the run supports, as plain numbers (the JSON carries them)."""
        out: dict[str, Any] = {
            "prefill_vs_transformers": {
                n: self.prefill_tps[n] / hf for n, hf in self.hf_prefill_tps.items() if hf
            },
            "prefill_share_of_roofline": {
                n: g / self.matmul_gflops for n, g in self.prefill_gflops.items()
            },
            "decode_vs_transformers": {
                b: self.decode_tps[b] / hf for b, hf in self.hf_decode_tps.items() if hf
            },
        }
        if self.decode_tps:
            lo, hi = min(self.decode_tps), max(self.decode_tps)
            out[f"decode_batch{hi}_vs_batch{lo}"] = self.decode_tps[hi] / self.decode_tps[lo]
        if self.floor_tps and 1 in self.decode_tps:
            out["decode_batch1_vs_bandwidth_floor"] = self.decode_tps[1] / self.floor_tps
        if self.read_floor_tps and 1 in self.decode_tps:
            out["decode_batch1_vs_read_floor"] = self.decode_tps[1] / self.read_floor_tps
        if self.json_pairs:
            out["json_decode_vs_free"] = self.json_vs_free
        return out

    def targets(self) -> list[tuple[str, bool, str]]:
        """(target, met, the figures behind the verdict) for each of the engine's targets."""
        out = []
        n = max(self.prefill_gflops)
        share = self.prefill_gflops[n] / self.matmul_gflops
        out.append(
            (
                f"prefill at {n} tokens >= 50% of the matmul roofline",
                share >= 0.5,
                f"{self.prefill_gflops[n]:.1f} of {self.matmul_gflops:.1f} GFLOP/s = {share:.0%}",
            )
        )
        for n, hf in sorted(self.hf_prefill_tps.items()):
            ratio = self.prefill_tps[n] / hf
            out.append(
                (
                    f"prefill at {n} tokens >= 1.0x transformers",
                    ratio >= 1.0,
                    f"{self.prefill_tps[n]:.1f} / {hf:.1f} tok/s = {ratio:.2f}x",
                )
            )
        if self.floor_tps and 1 in self.decode_tps:
            share = self.decode_tps[1] / self.floor_tps
            out.append(
                (
                    "batch-1 decode >= 90% of the memory-bandwidth floor",
                    share >= 0.9,
                    f"{self.decode_tps[1]:.1f} of {self.floor_tps:.1f} tok/s = {share:.0%}",
                )
            )
        if 8 in self.hf_decode_tps:
            ratio = self.decode_tps[8] / self.hf_decode_tps[8]
            out.append(
                (
                    "decode at batch 8 >= 1.5x transformers",
                    ratio >= 1.5,
                    f"{self.decode_tps[8]:.1f} / {self.hf_decode_tps[8]:.1f} tok/s = {ratio:.2f}x",
                )
            )
        lo, hi = min(self.decode_tps), max(self.decode_tps)
        scale = self.decode_tps[hi] / self.decode_tps[lo]
        out.append(
            (
                f"batch-{hi} decode >= 8x batch-{lo} decode",
                scale >= 8,
                f"{self.decode_tps[hi]:.1f} / {self.decode_tps[lo]:.1f} tok/s = {scale:.1f}x",
            )
        )
        if self.json_pairs:
            cost = 1 - self.json_vs_free
            out.append(
                (
                    f"batch-{JSON_BATCH} decode with a JSON schema costs <= 10%",
                    cost <= 0.10,
                    f"median of {len(self.json_pairs)} back-to-back pairs: {cost:.1%} slower",
                )
            )
        return out


def bandwidth_of(samples: list[float]) -> float:
    """The bandwidth a run states from its copy samples: their median, not their best.

    A model's weights are allocated once, and a decode step reads them wherever they landed.
    On the 2-core AMD EPYC VMs a fresh 1 GiB buffer copies at 34-41 GB/s most times and at
    57-70 GB/s in about one allocation of three (copies repeated on one buffer keep its
    rate), while reading the weights never went past 35 GB/s nor a plain read of any buffer
    past 48: the best sample states memory the weights do not get. The median is what a
    typical allocation gets; the report lists the spread.
    """
    return statistics.median(samples) if samples else 0.0


def render(figures: Figures) -> str:
    """The Markdown report."""

    def vs(ours: float, theirs: float | None) -> str:
        return f"{theirs:,.1f} | {ours / theirs:.2f}x" if theirs else "- | -"

    on_gpu = " on cpu" not in figures.engine  # "float32 on cpu, KV in float16"
    loads = figures.load_samples or [0.0]
    lines = [
        "# Built-in engine benchmark" + (f" on a GPU ({figures.engine})" if on_gpu else ""),
        "",
        "Written by `kvgate bench engine`"
        + (f" on commit `{figures.commit}`" if figures.commit else "")
        + "; every figure comes from the same run on the same machine, kvgate and "
        f"transformers measured in turn, each figure the best of {figures.reps}.",
        "",
        f"- model: `{figures.model}`, {figures.engine}, {figures.threads} torch threads",
        f"- machine: {figures.machine}; 1-minute load average {figures.load_average[0]:.1f} "
        f"at the start, {figures.load_average[1]:.1f} at the end, {min(loads):.1f} to "
        f"{max(loads):.1f} through the run",
        f"- {figures.engine.split()[0]} matmul roofline (best rate over 4 shapes, sampled "
        f"{len(figures.matmul_samples)} times next to the measurements): "
        f"**{figures.matmul_gflops:,.1f} GFLOP/s**",
        f"- memory bandwidth (a 1 GiB copy, bytes read plus written, the median of "
        f"{len(figures.bandwidth_samples)} freshly allocated buffers, which gave "
        f"{min(figures.bandwidth_samples, default=0.0):,.1f} to "
        f"{max(figures.bandwidth_samples, default=0.0):,.1f}): "
        f"**{figures.bandwidth_gbs:,.1f} GB/s**",
        f"- read-only bandwidth (a sum over a 1 GiB buffer, the median of "
        f"{len(figures.read_bandwidth_samples)} freshly allocated buffers, which gave "
        f"{min(figures.read_bandwidth_samples, default=0.0):,.1f} to "
        f"{max(figures.read_bandwidth_samples, default=0.0):,.1f}): "
        f"**{figures.read_bandwidth_gbs:,.1f} GB/s**",
        f"- decode: {DECODE_PROMPT}-token prompts, {figures.decode_steps} greedy tokens per request"
        + (f"; {figures.single_row}" if figures.single_row else ""),
        "",
        "## Prefill (one request, cold cache)",
        "",
        "| prompt tokens | kvgate tok/s | kvgate GFLOP/s | % of roofline | transformers tok/s | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, tps in figures.prefill_tps.items():
        share = figures.prefill_gflops[n] / figures.matmul_gflops
        lines.append(
            f"| {n} | {tps:,.1f} | {figures.prefill_gflops[n]:,.1f} | {share:.0%} | "
            f"{vs(tps, figures.hf_prefill_tps.get(n))} |"
        )
    lines += [
        "",
        "## Decode (concurrent requests, prefill excluded)",
        "",
        "| batch | kvgate tok/s | transformers tok/s | speed-up |",
        "|---:|---:|---:|---:|",
    ]
    for b, tps in figures.decode_tps.items():
        lines.append(f"| {b} | {tps:,.1f} | {vs(tps, figures.hf_decode_tps.get(b))} |")
    if figures.json_decode_tps:
        lines.append(f"| {JSON_BATCH}, JSON schema | {figures.json_decode_tps:,.1f} | - | - |")
    if figures.json_pairs:
        pairs = ", ".join(f"{free:,.1f} / {held:,.1f}" for free, held in figures.json_pairs)
        lines += [
            "",
            f"Batch {JSON_BATCH} free / with a JSON schema, run back to back (tok/s): {pairs}; "
            f"the median pair's ratio is {figures.json_vs_free:.3f}.",
        ]
    if figures.floor_tps:
        lines += [
            "",
            f"A batch-1 decode step reads at least {figures.decode_bytes / 1e6:,.1f} MB (every "
            "weight once, the LM head for the embedding, and the context's KV): at "
            f"{figures.bandwidth_gbs:,.1f} GB/s that is a floor of {figures.floor_tps:,.1f} tok/s.",
        ]
        if figures.read_floor_tps and 1 in figures.decode_tps:
            lines[-1] += (
                f" Read at the read-only rate, {figures.read_bandwidth_gbs:,.1f} GB/s, the same "
                f"bytes take a step of {figures.decode_bytes / figures.read_bandwidth_gbs / 1e6:,.1f} "
                f"ms, {figures.read_floor_tps:,.1f} tok/s: batch-1 decode is "
                f"{figures.decode_tps[1] / figures.read_floor_tps:.0%} of that."
            )
    lines += ["", "## Targets", ""]
    for target, met, detail in figures.targets():
        lines.append(f"- {'met' if met else '**missed**'}: {target} ({detail})")
    return "\n".join(lines) + "\n"
