"""``kvgate bench multiturn``: multi-turn conversations against a server, or the tier comparison.

Without ``--compare`` it plays the seeded workload against ``--url`` (a gateway or a
worker, any OpenAI-compatible server) and prints the run's statistics. With ``--compare``
it starts Postgres, SeaweedFS and the built-in worker in each tier configuration on this
machine, primes each workload once and plays the same follow-up turns on each
configuration (``infinite``, the ideal, among them), measures restore-vs-resident TTFT and
the no-reuse overhead, and writes JSON, a markdown table and plots under
``docs/benchmarks/`` (the full run also writes ``docs/benchmarks.md``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from pathlib import Path

import click

from kvgate.bench.multiturn.driver import Plan, Target, run
from kvgate.bench.multiturn.metrics import summarize
from kvgate.bench.multiturn.workload import WORKLOADS, conversations


@click.command()
@click.option("--url", help="OpenAI-compatible base URL (gateway or worker) to drive.")
@click.option("--api-key", default="", envvar="KVGATE_BENCH_API_KEY", help="Bearer key.")
@click.option("--model", default="", help="Model id (default: the first the server lists).")
@click.option(
    "--workload",
    type=click.Choice(["chat", "docqa", "both"]),
    help="chat: answers of 80-120 tokens; docqa: documents of 3-6k tokens, then questions "
    "answered in 1-8 tokens. [default: chat; --compare: both]",
)
@click.option("--conversations", "n_conv", type=int, help="[default: 32; --compare: its spec]")
@click.option("--active", type=int, help="Conversations in play (K) [default: 16].")
@click.option("--clients", type=int, help="Concurrent clients (C) [default: 8].")
@click.option("--warmup", type=int, help="Requests left out of the statistics [default: 16].")
@click.option(
    "--max-requests",
    type=int,
    help="Stop after this many (0: all turns) [default: 0]. With --compare: measured "
    "follow-up turns per configuration, instead of what the quick run's time budget allows.",
)
@click.option(
    "--no-reuse-requests",
    type=int,
    help="With --compare: no-reuse requests, an odd number (3 or more) of whole waves "
    "(0 skips that part).",
)
@click.option("--think-time", type=float, default=0.0, help="Seconds between a client's turns.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--common-prefix", type=int, help="Tokens of the shared system prompt.")
@click.option("--unique-mean", type=int, help="Mean tokens of the first-turn document.")
@click.option("--unique-max", type=int, help="Most tokens of the first-turn document.")
@click.option("--user-tokens", type=(int, int), help="Tokens of a user message (range).")
@click.option("--answer-tokens", type=(int, int), help="Tokens of an answer (range).")
@click.option("--turns", type=(int, int), help="User turns per conversation (range).")
@click.option("--compare", is_flag=True, help="Start and compare the tier configurations here.")
@click.option(
    "--quick", is_flag=True, help="With --compare: the run sized to end within 15 minutes."
)
@click.option("--configs", default="", help="With --compare: comma list (default: all).")
@click.option(
    "--budget-s",
    type=float,
    help="With --compare --quick: seconds the whole run may take; its measured turns are "
    "sized to fit [default: 900].",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write figures here.")
@click.option("--name", help="With --compare: stem of the docs/benchmarks/ outputs.")
@click.option(
    "--report-from",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rewrite the outputs of a saved --compare JSON without running anything.",
)
def multiturn(url: str | None, api_key: str, model: str, workload: str | None,
              n_conv: int | None, active: int | None, clients: int | None,
              warmup: int | None, max_requests: int | None, no_reuse_requests: int | None,
              think_time: float, seed: int, common_prefix: int | None,
              unique_mean: int | None, unique_max: int | None,
              user_tokens: tuple[int, int] | None, answer_tokens: tuple[int, int] | None,
              turns: tuple[int, int] | None, compare: bool, quick: bool, configs: str,
              budget_s: float | None, json_path: Path | None, name: str | None,
              report_from: Path | None) -> None:  # fmt: skip
    """Multi-turn conversations: drive a server, or compare the KV tier configurations."""
    given = {"common_prefix": common_prefix, "unique_prefix_mean": unique_mean,
             "unique_prefix_max": unique_max, "user_tokens": user_tokens,
             "answer_tokens": answer_tokens, "turns": turns}  # fmt: skip
    shape_over = {k: v for k, v in given.items() if v is not None}
    if report_from is not None:
        from kvgate.bench.multiturn.run import rewrite

        data = rewrite(json.loads(report_from.read_text()), name)
    elif compare:
        from kvgate.bench.multiturn.run import compare_run

        if shape_over:
            raise click.UsageError("--compare plays the named workloads: give --workload")
        sizes = {"conversations": n_conv, "clients": clients, "measured": max_requests,
                 "no_reuse_requests": no_reuse_requests, "budget_s": budget_s}  # fmt: skip
        overrides = {k: v for k, v in sizes.items() if v is not None}
        chosen = ("chat", "docqa") if workload in (None, "both") else (workload,)
        data = compare_run(
            quick=quick, configs=configs, workloads=chosen, seed=seed, overrides=overrides,
            name=name,
        )  # fmt: skip
    else:
        if not url:
            raise click.UsageError("give --url to drive a server, or --compare to start them here")
        if workload == "both":
            raise click.UsageError("--workload both is for --compare; pick chat or docqa")
        shape = replace(WORKLOADS[workload or "chat"], **shape_over)
        convs = conversations(32 if n_conv is None else n_conv, shape, seed)
        plan = Plan(
            8 if clients is None else clients,
            16 if active is None else active,
            16 if warmup is None else warmup,
            max_requests or 0,
            think_time,
        )
        results = asyncio.run(run(Target(url.rstrip("/"), api_key, model), convs, plan))
        data = {"shape": asdict(shape), "plan": asdict(plan), **summarize(results).as_dict()}
        for key in ("requests", "errors", "rps", "output_tps", "ttft_p50", "ttft_p90",
                    "ttft_p99", "tpot_p50", "cached_ratio"):  # fmt: skip
            click.echo(f"{key:>14}: {data[key]:.4g}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        click.echo(f"wrote {json_path}")
