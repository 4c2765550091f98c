"""``kvgate bench multiturn``: multi-turn conversations against a server, or the tier comparison.

Without ``--compare`` it plays the seeded workload against ``--url`` (a gateway or a
worker, any OpenAI-compatible server) and prints the run's statistics. With ``--compare``
it starts Postgres, SeaweedFS and the built-in worker in each tier configuration on this
machine, plays the identical workload on each, measures restore-vs-resident TTFT and the
no-reuse overhead, and writes JSON, a markdown table and plots under ``docs/benchmarks/``
(the full run also writes ``docs/benchmarks.md``).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import click

from kvgate.bench_mt_driver import Plan, Target, run
from kvgate.bench_mt_metrics import summarize
from kvgate.bench_mt_workload import Shape, conversations

DOCS = Path("docs")


def kv_bytes_per_token() -> int:
    """KV bytes per token of the default model at the dtype the CPU worker uses."""
    import torch

    from kvgate.models import DEFAULT_MODEL, ensure_model
    from kvgate.settings import load_settings
    from workers.engine.engine import EngineOptions
    from workers.engine.gguf_metadata import GGUFMetadata
    from workers.engine.weights_gguf import gguf_config

    path = ensure_model(load_settings().models_dir, DEFAULT_MODEL)
    _, dtype = EngineOptions(device="cpu").resolved()
    itemsize = torch.empty((), dtype=dtype).element_size()
    return gguf_config(GGUFMetadata.open(path)).kv_bytes_per_token(itemsize)


def machine() -> dict[str, object]:
    """What the figures were measured on, including how busy the machine was."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg(),
    }


@click.command()
@click.option("--url", help="OpenAI-compatible base URL (gateway or worker) to drive.")
@click.option("--api-key", default="", envvar="KVGATE_BENCH_API_KEY", help="Bearer key.")
@click.option("--model", default="", help="Model id (default: the first the server lists).")
@click.option("--conversations", "n_conv", type=int, default=32, show_default=True)
@click.option(
    "--active", type=int, default=16, show_default=True, help="Conversations in play (K)."
)
@click.option("--clients", type=int, default=8, show_default=True, help="Concurrent clients (C).")
@click.option("--warmup", type=int, default=16, show_default=True, help="Requests left out.")
@click.option("--max-requests", type=int, default=0, help="Stop after this many (0: all turns).")
@click.option("--think-time", type=float, default=0.0, help="Seconds between a client's turns.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--common-prefix", type=int, default=Shape.common_prefix, show_default=True)
@click.option("--unique-mean", type=int, default=Shape.unique_prefix_mean, show_default=True)
@click.option("--unique-max", type=int, default=Shape.unique_prefix_max, show_default=True)
@click.option("--user-tokens", type=(int, int), default=Shape.user_tokens, show_default=True)
@click.option("--answer-tokens", type=(int, int), default=Shape.answer_tokens, show_default=True)
@click.option("--turns", type=(int, int), default=Shape.turns, show_default=True)
@click.option("--compare", is_flag=True, help="Start and compare the tier configurations here.")
@click.option("--quick", is_flag=True, help="With --compare: the small run (a few conversations).")
@click.option("--configs", default="", help="With --compare: comma list (default: all).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write figures here.")
def multiturn(url: str | None, api_key: str, model: str, n_conv: int, active: int, clients: int,
              warmup: int, max_requests: int, think_time: float, seed: int, common_prefix: int,
              unique_mean: int, unique_max: int, user_tokens: tuple[int, int],
              answer_tokens: tuple[int, int], turns: tuple[int, int], compare: bool, quick: bool,
              configs: str, json_path: Path | None) -> None:  # fmt: skip
    """Multi-turn conversations: drive a server, or compare the KV tier configurations."""
    shape = Shape(common_prefix, unique_mean, unique_max, Shape.unique_prefix_sigma,
                  user_tokens, answer_tokens, turns)  # fmt: skip
    if compare:
        from kvgate.bench_mt_run import compare_run

        data = compare_run(quick=quick, configs=configs, shape=shape, seed=seed)
    else:
        if not url:
            raise click.UsageError("give --url to drive a server, or --compare to start them here")
        convs = conversations(n_conv, shape, seed)
        plan = Plan(clients, active, warmup, max_requests, think_time)
        results = asyncio.run(run(Target(url.rstrip("/"), api_key, model), convs, plan))
        data = {"shape": asdict(shape), "plan": asdict(plan), **summarize(results).as_dict()}
        for key in ("requests", "errors", "rps", "output_tps", "ttft_p50", "ttft_p90",
                    "ttft_p99", "tpot_p50", "cached_ratio"):  # fmt: skip
            click.echo(f"{key:>14}: {data[key]:.4g}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        click.echo(f"wrote {json_path}")


def run_dir() -> Path:
    """A scratch directory for one comparison's services and logs."""
    return Path(tempfile.mkdtemp(prefix=f"kvbench-{time.strftime('%H%M%S')}-"))
