"""One ``kvgate bench multiturn --compare`` run, from starting the services to the written docs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, replace
from typing import Any

import click

from kvgate.bench.multiturn import restore as restore_pair
from kvgate.bench.multiturn import stack as bench_stack
from kvgate.bench.multiturn.compare import CONFIGS, FULL, OBJECT_CONFIGS, QUICK, Compare
from kvgate.bench.multiturn.docs import provenance, write_docs
from kvgate.bench.multiturn.environment import (
    DOCS,
    kv_bytes_per_token,
    machine,
    run_dir,
    served_model,
)
from kvgate.bench.multiturn.noreuse import wave_count
from kvgate.bench.multiturn.report import markdown_table, physics, plots, verdicts
from kvgate.bench.multiturn.workload import Shape
from kvgate.bench.output import source_commit


def compare_run(
    *,
    quick: bool,
    configs: str,
    shape: Shape,
    seed: int,
    overrides: dict[str, int] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Run the comparison, write its outputs under docs/benchmarks/, return the figures.

    ``overrides`` replace sizes of the quick or full spec; ``name`` is the output stem
    (default ``multiturn_quick`` or ``multiturn``).
    """
    spec = replace(QUICK if quick else FULL, shape=shape, seed=seed, **(overrides or {}))
    only = tuple(c for c in configs.split(",") if c) or CONFIGS
    if unknown := set(only) - set(CONFIGS):
        raise click.UsageError(f"unknown configurations {sorted(unknown)}; pick from {CONFIGS}")
    if spec.no_reuse_requests:
        try:
            wave_count(spec.no_reuse_requests, spec.clients)
        except ValueError as exc:
            raise click.UsageError(f"--no-reuse-requests: {exc}; or 0 to skip it") from exc
    kv = kv_bytes_per_token()
    with_s3 = bool(OBJECT_CONFIGS & set(only))
    # SIGTERM (a time limit, a supervisor) unwinds like Ctrl-C: every worker, Postgres and
    # SeaweedFS this run started is stopped by the blocks that started it.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    root = run_dir()
    click.echo(f"services, logs and NAS under {root}", err=True)
    started = time.perf_counter()
    data: dict[str, Any] = {
        "run": "quick" if quick else "full",
        "commit": source_commit(),
        "machine": machine(),
        "spec": asdict(spec),
        "configs_run": list(only),
        "kv_bytes_per_token": kv,
        **served_model(),
        "object_store": with_s3,
    }
    with bench_stack.services(root, with_s3=with_s3) as svc:
        compare = Compare(svc, spec, kv, root / "logs")
        data["working_set_tokens"] = compare.working_set_tokens()
        data["working_set_over_l1"] = data["working_set_tokens"] / spec.l1_tokens
        runs, no_reuse, failures = compare.run_all(only)
        data["failures"] = failures
        data["configs"] = {name: r.summary.as_dict() for name, r in runs.items()}
        data["config_seconds"] = {name: r.seconds for name, r in runs.items()}
        data["no_reuse"] = no_reuse
        if spec.no_reuse_requests:
            data["no_reuse_l1_tokens"] = compare.no_reuse_l1_tokens()
        click.echo("--- restore vs resident", err=True)
        try:
            restore = restore_pair.measure(svc, spec.restore_lengths, kv, seed, root / "logs")
        except (
            bench_stack.PartError,
            OSError,
            RuntimeError,
            subprocess.CalledProcessError,
        ) as exc:
            failures["restore"] = str(exc)
            click.echo(f"restore failed: {exc}", err=True)
            restore = {}
        data["restore"] = {str(n): v for n, v in restore.items()}
    for bulk in ("nas", "s3", "pg"):  # gigabytes of KV pages; the logs stay for reading
        shutil.rmtree(root / bulk, ignore_errors=True)
    data["machine"]["load_average_at_end"] = os.getloadavg()
    data["seconds"] = time.perf_counter() - started
    data = rewrite(data, name)
    for key, v in data["targets"].items():
        value = "—" if v["value"] is None else f"{v['value']:.3f}"
        click.echo(
            f"{key:>26}: {value:>8}  target {v['target']:<7} {'met' if v['met'] else 'MISSED'}"
        )
    return data


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def rewrite(data: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Verdicts and physics from ``data``'s measurements, then every output written again."""
    data["targets"] = verdicts(data)
    data["physics"] = physics(data)
    data.update({k: v for k, v in data["targets"].items()})  # the target figures, top level
    _write(data, name or ("multiturn_quick" if data["run"] == "quick" else "multiturn"))
    return data


#: output stem of the comparison run on a GPU, which docs/benchmarks.md shows beside the CPU one
GPU_STEM = "multiturn_cuda"


def _write(data: dict[str, Any], stem: str) -> None:
    """JSON, table and plots under docs/benchmarks/; docs/benchmarks.md from a full run, or
    from the quick run while no full run has been recorded, with the GPU run's section when
    one is recorded. A run given its own ``--name`` leaves docs/benchmarks.md alone."""
    out = DOCS / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    data["plots"] = [str(p.relative_to(DOCS)) for p in plots(data, out, stem)]
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    (out / f"{stem}.md").write_text(f"{provenance(data)}\n\n{markdown_table(data)}")
    if stem == "multiturn" or (stem == "multiturn_quick" and not (out / "multiturn.json").exists()):
        gpu = out / f"{GPU_STEM}.json"
        write_docs(
            data, DOCS / "benchmarks.md", json.loads(gpu.read_text()) if gpu.exists() else None
        )
