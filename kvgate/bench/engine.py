"""``kvgate bench engine``: the built-in engine's prefill and decode speed, against yardsticks.

Measured in one run on this machine: our engine's prefill tokens/s at 128/512/2048-token
prompts and decode tokens/s at batch 1/8/32, and at batch 8 with every request held to a
JSON schema (grammar-constrained decoding); the matmul roofline in the engine's device and
dtype (fp32 on a CPU, bf16 on a GPU); Hugging Face ``transformers`` on the same weights,
prompts, device and dtype. The figures and the verdict on each
target are printed and written to ``docs/benchmarks/engine.md`` (and ``--json``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import click
import torch

from kvgate.bench.hf import HFBaseline, matmul_gflops, prefill_flops, roofline_shapes
from kvgate.bench.output import cpu_name, source_commit
from kvgate.wiring.engine import (
    WorkerOptions,
    cores_to_the_engine,
    load_model,
    running_engine,
    worker_options,
)
from workers.engine.api import Engine, GenerateRequest, SamplingParams
from workers.engine.grammar import Grammar, Grammars

T = TypeVar("T")

PROMPT_LENGTHS = (128, 512, 2048)
DECODE_BATCHES = (1, 8, 32)
#: batch sizes at which transformers is run for the decode comparison
HF_DECODE_BATCHES = (1, 8)
#: prompt length of every decode-benchmark request
DECODE_PROMPT = 64
#: batch at which decode is measured with a JSON schema on every request too, and the
#: schema: records enough that no request completes it within the steps measured
JSON_BATCH = 8
JSON_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
    },
    "minItems": 64,
}


@dataclass
class Figures:
    """Everything one run measured; tokens/s keyed by prompt length or batch size."""

    model: str
    machine: str
    threads: int
    matmul_gflops: float
    #: dtype and device the engine ran in, e.g. ``float32 on cpu``
    engine: str = "float32 on cpu"
    prefill_tps: dict[int, float] = field(default_factory=dict)
    prefill_gflops: dict[int, float] = field(default_factory=dict)
    decode_tps: dict[int, float] = field(default_factory=dict)
    hf_prefill_tps: dict[int, float] = field(default_factory=dict)
    hf_decode_tps: dict[int, float] = field(default_factory=dict)
    #: decode tokens/s at ``JSON_BATCH`` with every request held to ``JSON_SCHEMA``
    json_decode_tps: float = 0.0
    decode_steps: int = 0
    #: every roofline sample (GFLOP/s); ``matmul_gflops`` is the best
    matmul_samples: list[float] = field(default_factory=list)
    #: 1-minute load average at the start and the end: above the CPU count, other processes
    #: competed for the cores and every figure is a lower bound
    load_average: tuple[float, float] = (0.0, 0.0)
    #: the git commit measured (see :func:`~kvgate.bench.output.source_commit`)
    commit: str | None = None

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
        lo, hi = min(self.decode_tps), max(self.decode_tps)
        scale = self.decode_tps[hi] / self.decode_tps[lo]
        out.append(
            (
                f"batch-{hi} decode >= 8x batch-{lo} decode",
                scale >= 8,
                f"{self.decode_tps[hi]:.1f} / {self.decode_tps[lo]:.1f} tok/s = {scale:.1f}x",
            )
        )
        for b in sorted(self.hf_decode_tps):
            ratio = self.decode_tps[b] / self.hf_decode_tps[b]
            out.append(
                (
                    f"decode at batch {b} >= 3x transformers",
                    ratio >= 3,
                    f"{self.decode_tps[b]:.1f} / {self.hf_decode_tps[b]:.1f} tok/s = {ratio:.1f}x",
                )
            )
        if self.json_decode_tps:
            free = self.decode_tps[JSON_BATCH]
            cost = 1 - self.json_decode_tps / free
            out.append(
                (
                    f"batch-{JSON_BATCH} decode with a JSON schema costs <= 10%",
                    cost <= 0.10,
                    f"{self.json_decode_tps:.1f} / {free:.1f} tok/s = {cost:.1%} slower",
                )
            )
        return out


def machine() -> str:
    """CPU model and core count, and the GPU if torch sees one (the figures mean little
    without them)."""
    cpu = f"{cpu_name()}, {os.cpu_count()} logical CPUs"
    return cpu + (f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts (so that no run is served from another's cache)."""
    rng = random.Random(seed)
    # Skip the lowest ids: special tokens (BOS/EOS/chat markup) live there in SmolLM2.
    return [[rng.randrange(256, vocab) for _ in range(length)] for _ in range(count)]


async def engine_prefill_tps(engine: Engine, prompt: Sequence[int]) -> float:
    """Prompt tokens/s of one request that generates a single token from a cold cache."""
    engine.flush_cache()
    request = GenerateRequest(
        rid=f"bench-{uuid.uuid4().hex}",
        input_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
    )
    start = time.perf_counter()
    async for _ in engine.generate(request):
        pass
    return len(prompt) / (time.perf_counter() - start)


async def engine_decode_tps(
    engine: Engine, prompts: Sequence[Sequence[int]], steps: int, grammar: Grammar | None = None
) -> float:
    """Generated tokens/s once every request of the batch is decoding (prefill excluded),
    every request held to ``grammar`` if one is given."""
    engine.flush_cache()
    started: list[float] = []
    after: list[tuple[float, int]] = []  # (time, tokens) received after the request's first

    async def one(prompt: Sequence[int]) -> None:
        request = GenerateRequest(
            rid=f"bench-{uuid.uuid4().hex}",
            input_ids=tuple(prompt),
            sampling=SamplingParams(
                max_tokens=steps + 1, temperature=0.0, ignore_eos=True, grammar=grammar
            ),
        )
        async for event in engine.generate(request):
            now = time.perf_counter()
            new = len(event.token_ids)
            if new and event.completion_tokens == new:  # this event carries the first token
                started.append(now)
                new -= 1
            after.append((now, new))

    await asyncio.gather(*(one(p) for p in prompts))
    # The window opens when the last request finished its prefill: from then on, all decode.
    t0 = max(started)
    tokens = sum(n for t, n in after if t > t0)
    return tokens / (max(t for t, _ in after) - t0)


def on_own_thread(work: Callable[[], T], threads: int) -> T:
    """``work()`` run on a thread of its own with ``threads`` torch threads, which then ends.

    The engine computes on its thread and a worker process keeps every other thread to one
    torch thread (:func:`kvgate.wiring.engine.cores_to_the_engine`): a second OpenMP team beside
    the engine's makes its decode ~30% slower. A yardstick run on the main thread with every
    core would leave such a team for the rest of the run. A thread's team ends with it, so
    each yardstick runs with the cores to itself and leaves the engine alone with them.
    """

    def run() -> T:
        torch.set_num_threads(threads)
        return work()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-yardstick") as pool:
        return pool.submit(run).result()


async def measure(
    options: WorkerOptions, quick: bool, with_hf: bool, say: Callable[[str], None]
) -> Figures:
    """Run every measurement on the model ``options`` selects; ``say`` reports progress.

    Each figure is the best of a few repetitions: on a shared machine the best run is the
    one least disturbed by other processes, which is what we want to compare. For the same
    reason the roofline is sampled next to every measurement and its best sample kept. The
    engine is set up as ``kvgate worker`` sets it up (one team of OpenMP threads, on the
    engine's thread), and the yardsticks run on short-lived threads of their own; the
    calling thread gets its torch thread count back at the end.
    """
    caller_threads = torch.get_num_threads()
    try:
        return await _measure(cores_to_the_engine(options), quick, with_hf, say)
    finally:
        torch.set_num_threads(caller_threads)


async def _measure(
    options: WorkerOptions, quick: bool, with_hf: bool, say: Callable[[str], None]
) -> Figures:
    """:func:`measure`, the calling thread already down to one torch thread."""
    threads = options.engine.threads
    loaded = load_model(options)
    device, dtype = options.engine.resolved()
    shapes = roofline_shapes(loaded.config)
    steps, reps = (16, 1) if quick else (64, 3)
    figures = Figures(
        model=loaded.model_id,
        machine=machine(),
        commit=source_commit(),
        threads=threads,
        matmul_gflops=0.0,
        engine=options.engine.describe(),
        decode_steps=steps,
        load_average=(os.getloadavg()[0], 0.0),
    )

    def roofline() -> None:
        sample = on_own_thread(
            functools.partial(matmul_gflops, shapes, device=device, dtype=dtype), threads
        )
        figures.matmul_samples.append(sample)
        figures.matmul_gflops = max(figures.matmul_samples)

    roofline()
    say(f"matmul roofline: {figures.matmul_gflops:.1f} GFLOP/s")
    vocab = loaded.config.vocab_size
    prompts = {n: random_prompts(1, n, vocab, seed=i)[0] for i, n in enumerate(PROMPT_LENGTHS)}
    batches = {b: random_prompts(b, DECODE_PROMPT, vocab, seed=1000 + b) for b in DECODE_BATCHES}
    with running_engine(loaded, options) as engine:
        # Warm-up: first-call allocations and kernel selection are not what we measure.
        await engine_prefill_tps(engine, random_prompts(1, 32, vocab, seed=99)[0])
        for n, prompt in prompts.items():
            roofline()
            best = max([await engine_prefill_tps(engine, prompt) for _ in range(reps)])
            figures.prefill_tps[n] = best
            figures.prefill_gflops[n] = prefill_flops(loaded.config, n) * best / n / 1e9
            say(f"kvgate prefill {n}: {best:.1f} tok/s")
        for b, batch in batches.items():
            best = max([await engine_decode_tps(engine, batch, steps) for _ in range(reps)])
            figures.decode_tps[b] = best
            say(f"kvgate decode batch {b}: {best:.1f} tok/s")
        # the JSON figure and the free one again, alternately: the same load on both
        grammar = Grammars.for_tokenizer(
            loaded.tokenizer.backend, vocab_size=vocab, stop_token_ids=engine.eos_token_ids
        ).json_schema(JSON_SCHEMA)
        batch = batches[JSON_BATCH]
        for _ in range(max(reps, 2)):
            free = await engine_decode_tps(engine, batch, steps)
            figures.decode_tps[JSON_BATCH] = max(figures.decode_tps[JSON_BATCH], free)
            held = await engine_decode_tps(engine, batch, steps, grammar)
            figures.json_decode_tps = max(figures.json_decode_tps, held)
        say(
            f"kvgate decode batch {JSON_BATCH} with a JSON schema: {figures.json_decode_tps:.1f} tok/s"
        )
    roofline()

    def transformers() -> None:
        hf = HFBaseline(loaded.config, loaded.state, device=device, dtype=dtype)
        hf.prefill_tokens_per_s(random_prompts(1, 32, vocab, seed=99)[0])  # warm-up, as ours
        for n, prompt in prompts.items():
            figures.hf_prefill_tps[n] = max(hf.prefill_tokens_per_s(prompt) for _ in range(reps))
            say(f"transformers prefill {n}: {figures.hf_prefill_tps[n]:.1f} tok/s")
        for b in HF_DECODE_BATCHES:
            figures.hf_decode_tps[b] = max(
                hf.decode_tokens_per_s(batches[b], steps) for _ in range(reps)
            )
            say(f"transformers decode batch {b}: {figures.hf_decode_tps[b]:.1f} tok/s")

    if with_hf:
        on_own_thread(transformers, threads)
    roofline()
    say(
        f"matmul roofline, best of {len(figures.matmul_samples)} samples: {figures.matmul_gflops:.1f}"
    )
    figures.load_average = (figures.load_average[0], os.getloadavg()[0])
    return figures


def render(figures: Figures) -> str:
    """The Markdown report."""

    def vs(ours: float, theirs: float | None) -> str:
        return f"{theirs:,.1f} | {ours / theirs:.1f}x" if theirs else "- | -"

    on_gpu = " on cpu" not in figures.engine  # "float32 on cpu, KV in float16"
    lines = [
        "# Built-in engine benchmark" + (f" on a GPU ({figures.engine})" if on_gpu else ""),
        "",
        "Written by `kvgate bench engine`"
        + (f" on commit `{figures.commit}`" if figures.commit else "")
        + "; every figure comes from the same run on the same machine.",
        "",
        f"- model: `{figures.model}`, {figures.engine}, {figures.threads} torch threads",
        f"- machine: {figures.machine}; 1-minute load average {figures.load_average[0]:.1f} "
        f"at the start, {figures.load_average[1]:.1f} at the end",
        f"- {figures.engine.split()[0]} matmul roofline (best rate over 4 shapes, sampled "
        f"{len(figures.matmul_samples)} times next to the measurements): "
        f"**{figures.matmul_gflops:,.1f} GFLOP/s**",
        f"- decode: {DECODE_PROMPT}-token prompts, {figures.decode_steps} greedy tokens per request",
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
    lines += ["", "## Targets", ""]
    for target, met, detail in figures.targets():
        lines.append(f"- {'met' if met else '**missed**'}: {target} ({detail})")
    return "\n".join(lines) + "\n"


@click.command()
@click.option(
    "--model",
    default=None,
    help="GGUF file, safetensors dir, tiny-random or random:<preset>; default SmolLM2.",
)
@click.option("--quick", is_flag=True, help="Fewer decode steps and repetitions (about a minute).")
@click.option("--no-hf", is_flag=True, help="Skip the transformers comparison.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("docs/benchmarks/engine.md"),
    show_default=True,
    help="Where the Markdown report goes.",
)
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Also write the figures as JSON."
)
def engine(model: str | None, quick: bool, no_hf: bool, out: Path, json_path: Path | None) -> None:
    """Prefill and decode tokens/s of the built-in engine vs the matmul roofline and transformers."""
    say = functools.partial(click.echo, err=True)
    figures = asyncio.run(measure(worker_options(model=model), quick, not no_hf, say))
    report = render(figures)
    click.echo(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    if json_path is not None:
        data = asdict(figures) | {
            "targets": [{"target": t, "met": m, "detail": d} for t, m, d in figures.targets()]
        }
        json_path.write_text(json.dumps(data, indent=2))
    click.echo(f"wrote {out}" + (f" and {json_path}" if json_path else ""))
