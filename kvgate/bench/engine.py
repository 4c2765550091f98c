"""``kvgate bench engine``: the built-in engine's prefill and decode speed, against yardsticks.

Measured in one run on this machine: our engine's prefill tokens/s at 128/512/2048/4096-token
prompts and decode tokens/s at batch 1/8/32, and at batch 8 with every request held to a
JSON schema (grammar-constrained decoding); Hugging Face ``transformers`` on the same
weights, prompts, device and dtype, measured in turn with ours; the matmul roofline in the
engine's device and dtype (fp32 on a CPU, bf16 on a GPU) and the memory bandwidth, whose
ratio to the bytes a decode step must read is the floor under batch-1 decode, with the
bandwidth of a pass that only reads beside it (the bound of a step that only reads). The figures,
their ratios and the verdict on each target are printed and written to
``docs/benchmarks/engine.md`` (and ``--json``).
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
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

import click
import torch

from kvgate.bench.engine_figures import (
    DECODE_BATCHES,
    DECODE_PROMPT,
    HF_DECODE_BATCHES,
    JSON_BATCH,
    PROMPT_LENGTHS,
    Figures,
    bandwidth_of,
    render,
)
from kvgate.bench.hf import (
    HFBaseline,
    copy_bandwidth,
    decode_bytes,
    matmul_gflops,
    prefill_flops,
    read_bandwidth,
    roofline_shapes,
)
from kvgate.bench.output import cpu_name, source_commit
from kvgate.wiring.engine import (
    WorkerOptions,
    load_model,
    running_engine,
    serving_process,
    worker_options,
)
from workers.engine.api import Engine, GenerateRequest, SamplingParams
from workers.engine.grammar import Grammar, Grammars

T = TypeVar("T")

#: back-to-back (free, JSON schema) decode pairs whose median ratio is the grammar's cost
JSON_PAIRS = 9
#: fresh buffers copied at each yardstick sample (the bandwidth is their median over the run)
BANDWIDTH_DRAWS = 2

#: the schema every request of the JSON decode figure is held to: records enough that no
#: request completes it within the steps measured
JSON_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
    },
    "minItems": 64,
}


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
    reason the roofline is sampled between measurements and its best sample kept; the
    bandwidth is sampled there too, on fresh buffers, and their median kept
    (:func:`~kvgate.bench.engine_figures.bandwidth_of` says why). The engine is set up as
    ``kvgate worker`` sets it up (one team of OpenMP threads, on the engine's thread), and
    the yardsticks run on short-lived threads of their own; the calling thread gets its
    torch thread count back at the end.
    """
    caller_threads = torch.get_num_threads()
    try:
        return await _measure(serving_process(options), quick, with_hf, say)
    finally:
        torch.set_num_threads(caller_threads)


async def _measure(
    options: WorkerOptions, quick: bool, with_hf: bool, say: Callable[[str], None]
) -> Figures:
    """:func:`measure`, the calling thread already down to one torch thread.

    kvgate and transformers are measured in turn, prompt by prompt and batch by batch, and
    the whole round repeated: on a machine shared with other work the load drifts over
    minutes, and figures taken far apart would compare the load as much as the code.
    """
    threads = options.engine.threads
    loaded = load_model(options)
    config = loaded.config
    device, dtype = options.engine.resolved()
    shapes = roofline_shapes(config)
    steps, reps = (16, 2) if quick else (64, 3)
    figures = Figures(
        model=loaded.model_id,
        machine=machine(),
        commit=source_commit(),
        threads=threads,
        matmul_gflops=0.0,
        engine=options.engine.describe(),
        decode_steps=steps,
        reps=reps,
        load_average=(os.getloadavg()[0], 0.0),
        # batch 1 over the middle of the window measured: the prompt and half the steps
        decode_bytes=decode_bytes(
            config,
            dtype.itemsize,
            options.engine.kv_bytes_per_token(config),
            DECODE_PROMPT + steps // 2,
        ),
    )

    def yardsticks() -> None:
        """A sample of the roofline and the load, and :data:`BANDWIDTH_DRAWS` of the bandwidth."""
        figures.load_samples.append(os.getloadavg()[0])
        gflops = functools.partial(matmul_gflops, shapes, device=device, dtype=dtype)
        figures.matmul_samples.append(on_own_thread(gflops, threads))
        figures.matmul_gflops = max(figures.matmul_samples)
        bandwidth = functools.partial(copy_bandwidth, device=device)
        reading = functools.partial(read_bandwidth, device=device)
        for _ in range(BANDWIDTH_DRAWS):
            figures.bandwidth_samples.append(on_own_thread(bandwidth, threads))
            figures.read_bandwidth_samples.append(on_own_thread(reading, threads))
        figures.bandwidth_gbs = bandwidth_of(figures.bandwidth_samples)
        figures.read_bandwidth_gbs = bandwidth_of(figures.read_bandwidth_samples)

    def keep_best(into: dict[int, float], key: int, value: float, who: str) -> None:
        into[key] = max(into.get(key, 0.0), value)
        say(f"{who}: {value:.1f} tok/s (best {into[key]:.1f})")

    yardsticks()
    say(f"roofline {figures.matmul_gflops:.1f} GFLOP/s, bandwidth {figures.bandwidth_gbs:.1f} GB/s")
    vocab = config.vocab_size
    context = options.engine.context_length or config.max_position_embeddings
    prompts = {  # the lengths that leave the model room for the token generated
        n: random_prompts(1, n, vocab, seed=i)[0]
        for i, n in enumerate(PROMPT_LENGTHS)
        if n < context
    }
    batches = {b: random_prompts(b, DECODE_PROMPT, vocab, seed=1000 + b) for b in DECODE_BATCHES}
    warm_up = random_prompts(1, 32, vocab, seed=99)[0]
    hf: HFBaseline | None = None
    if with_hf:
        hf = on_own_thread(
            lambda: HFBaseline(config, loaded.state, device=device, dtype=dtype), threads
        )
        on_own_thread(functools.partial(hf.prefill_tokens_per_s, warm_up), threads)
    with running_engine(loaded, options) as engine:
        if engine.model.single_row is not None:
            figures.single_row = engine.model.single_row.describe()
        # Warm-up: first-call allocations and kernel selection are not what we measure.
        await engine_prefill_tps(engine, warm_up)
        for _ in range(reps):
            for n, prompt in prompts.items():
                keep_best(
                    figures.prefill_tps,
                    n,
                    await engine_prefill_tps(engine, prompt),
                    f"kvgate prefill {n}",
                )
                if hf is not None:
                    tps = on_own_thread(functools.partial(hf.prefill_tokens_per_s, prompt), threads)
                    keep_best(figures.hf_prefill_tps, n, tps, f"transformers prefill {n}")
            yardsticks()
            for b, batch in batches.items():
                tps = await engine_decode_tps(engine, batch, steps)
                keep_best(figures.decode_tps, b, tps, f"kvgate decode batch {b}")
                if hf is not None and b in HF_DECODE_BATCHES:
                    run = functools.partial(hf.decode_tokens_per_s, batch, steps)
                    keep_best(
                        figures.hf_decode_tps,
                        b,
                        on_own_thread(run, threads),
                        f"transformers decode batch {b}",
                    )
        # the JSON figure beside the free one, in back-to-back pairs (each first in turn)
        grammar = Grammars.for_tokenizer(
            loaded.tokenizer.backend, vocab_size=vocab, stop_token_ids=engine.eos_token_ids
        ).json_schema(JSON_SCHEMA)
        batch = batches[JSON_BATCH]
        for i in range(JSON_PAIRS):
            runs = [None, grammar] if i % 2 == 0 else [grammar, None]
            tps = {g is not None: await engine_decode_tps(engine, batch, steps, g) for g in runs}
            figures.json_pairs.append((tps[False], tps[True]))
            figures.decode_tps[JSON_BATCH] = max(figures.decode_tps[JSON_BATCH], tps[False])
            figures.json_decode_tps = max(figures.json_decode_tps, tps[True])
            say(
                f"kvgate decode batch {JSON_BATCH} free / JSON schema: {tps[False]:.1f} / {tps[True]:.1f} tok/s"
            )
        say(
            f"JSON schema at batch {JSON_BATCH}: {1 - figures.json_vs_free:.1%} slower (median pair)"
        )
    yardsticks()
    for n, tps in figures.prefill_tps.items():
        figures.prefill_gflops[n] = prefill_flops(config, n) * tps / n / 1e9
    figures.load_average = (figures.load_average[0], os.getloadavg()[0])
    return figures


def with_history(report: str, out: Path) -> str:
    """``report`` with a pointer to the hand-written history beside ``out``
    (``<stem>_history.md``: profiles, experiments, earlier machines) where there is one.
    The command rewrites ``out`` whole; what people write about its figures lives in the
    other file, so that no run of the command erases it."""
    history = out.with_name(f"{out.stem}_history.md")
    if not history.exists():
        return report
    return (
        f"{report.rstrip()}\n\n## Written by hand\n\nProfiles, experiments and the runs of "
        f"earlier commits and machines, kept apart so that this command never overwrites "
        f"them: [{history.name}]({history.name}).\n"
    )


@click.command()
@click.option(
    "--model",
    default=None,
    help="GGUF file, safetensors dir, tiny-random or random:<preset>; default SmolLM2.",
)
@click.option(
    "--quick", is_flag=True, help="16 decode steps instead of 64, best of 2 instead of 3."
)
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
    """Prefill and decode tokens/s of the built-in engine vs transformers, the matmul roofline
    and the memory-bandwidth floor."""
    say = functools.partial(click.echo, err=True)
    figures = asyncio.run(measure(worker_options(model=model), quick, not no_hf, say))
    report = with_history(render(figures), out)
    click.echo(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    if json_path is not None:
        data = asdict(figures) | {
            "ratios": figures.ratios(),
            "targets": [{"target": t, "met": m, "detail": d} for t, m, d in figures.targets()],
        }
        json_path.write_text(json.dumps(data, indent=2))
    click.echo(f"wrote {out}" + (f" and {json_path}" if json_path else ""))
