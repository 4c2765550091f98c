"""One ``kvgate bench multiturn --compare`` run, from starting the services to the written docs.

Order: the served model converted once (so that no worker start pays for it); Postgres and
SeaweedFS; a calibration worker times this machine (:mod:`kvgate.bench.multiturn.sizing`),
from which a budgeted run sizes its measured turns (:mod:`kvgate.bench.multiturn.budget`);
then the restore turns and the no-reuse pair, whose sizes are fixed; then each workload
(``chat``, ``docqa``) is primed and played in every configuration
(:mod:`kvgate.bench.multiturn.compare`), its measured turns sized again after priming from
the seconds really left. The fixed phases go first so that this second sizing reads their
real length, not a prediction of it: a quick run that played them last had set 120 s
aside for what took 88, and ended at 635 of its 900 s with 2 measured chat turns a
configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import httpx

from kvgate.bench.multiturn import budget, floors, sizing
from kvgate.bench.multiturn import restore as restore_pair
from kvgate.bench.multiturn import stack as bench_stack
from kvgate.bench.multiturn.compare import CONFIGS, OBJECT_CONFIGS, Compare
from kvgate.bench.multiturn.docs import provenance, write_docs
from kvgate.bench.multiturn.environment import (
    DOCS,
    kv_bytes_per_token,
    machine,
    prepare_served_model,
    run_dir,
    served_model,
)
from kvgate.bench.multiturn.interleave import Played
from kvgate.bench.multiturn.noreuse import play_pair, wave_count
from kvgate.bench.multiturn.report import figures, markdown_table, physics, plots, verdicts
from kvgate.bench.multiturn.specs import FULL, QUICK, RunSpec, spec_dict
from kvgate.bench.multiturn.workload import WORKLOADS, conversations
from kvgate.bench.output import source_commit


def compare_run(
    *,
    quick: bool,
    configs: str,
    workloads: tuple[str, ...],
    seed: int,
    overrides: dict[str, int] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Run the comparison, write its outputs under docs/benchmarks/, return the figures.

    ``overrides`` (``clients``, ``conversations``, ``measured``, ``no_reuse_requests``,
    ``budget_s``) replace sizes of the quick or full spec (a given ``measured`` turns the
    budget off);
    ``name`` is the output stem (default ``multiturn_quick`` or ``multiturn``).
    """
    spec = QUICK if quick else FULL
    over = dict(overrides or {})
    for key in ("no_reuse_requests", "budget_s"):
        if key in over:
            spec = replace(spec, **{key: over.pop(key)})
    if "measured" in over:
        spec = replace(spec, budget_s=0)
    specs = [replace(w, seed=seed, **over) for w in spec.workloads if w.workload in workloads]
    only = tuple(c for c in configs.split(",") if c) or CONFIGS
    if unknown := set(only) - set(CONFIGS):
        raise click.UsageError(f"unknown configurations {sorted(unknown)}; pick from {CONFIGS}")
    if spec.no_reuse_requests:
        try:
            wave_count(spec.no_reuse_requests, spec.no_reuse_clients)
        except ValueError as exc:
            raise click.UsageError(f"--no-reuse-requests: {exc}; or 0 to skip it") from exc
    kv = kv_bytes_per_token()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwinds like Ctrl-C: every part stops
    root = run_dir()
    click.echo(f"services, logs and NAS under {root}", err=True)
    started = time.perf_counter()
    data: dict[str, Any] = {
        "run": "quick" if quick else "full",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": source_commit(),
        "machine": machine(),
        "spec": spec_dict(spec, specs),
        "configs_run": list(only),
        "kv_bytes_per_token": kv,
        **served_model(),
        "object_store": bool(OBJECT_CONFIGS & set(only)),
        "failures": {},
        "workloads": {},
        "phase_seconds": {},
    }
    stopped: BaseException | None = None
    try:
        phase = started
        prepare_served_model()
        phase = _phase_ended(data, "model", phase)
        with bench_stack.services(root, with_s3=data["object_store"]) as svc:
            phase = _phase_ended(data, "services", phase)
            rates = _calibrate(svc, root, specs[0].clients if specs else 1)
            data["calibration"] = rates.as_dict()
            _phase_ended(data, "calibration", phase)
            compares = {s.workload: Compare(svc, s, kv, root / "logs") for s in specs}
            costs = _size(spec, compares, rates, only, data)
            _restore_and_no_reuse(svc, spec, kv, seed, root, data)
            for compare in compares.values():
                refit = _refitter(spec, compares, costs, only, data, started, compare)
                _play_workload(compare, only, data, refit)
    except (SystemExit, KeyboardInterrupt) as exc:  # a time limit: report what was measured
        stopped = exc
        data["failures"]["stopped"] = (
            "the run was stopped before its end; these are the figures it had"
        )
    data["configs"] = data["workloads"].get("chat", {}).get("configs", {})  # where they were
    for bulk in ("nas", "s3", "pg"):  # gigabytes of KV pages; the logs stay for reading
        shutil.rmtree(root / bulk, ignore_errors=True)
    data["machine"]["load_average_at_end"] = os.getloadavg()
    data["seconds"] = time.perf_counter() - started  # the wall_s figure
    data = rewrite(data, name)
    for key, v in data["targets"].items():
        value = "—" if v["value"] is None else f"{v['value']:.3f}"
        click.echo(
            f"{key:>26}: {value:>8}  target {v['target']:<7} {'met' if v['met'] else 'MISSED'}"
        )
    if stopped is not None:
        raise stopped
    return data


def _phase_ended(data: dict[str, Any], name: str, since: float) -> float:
    """Record in ``data`` that phase ``name``, begun at ``since``, ended now; returns now."""
    now = time.perf_counter()
    data["phase_seconds"][name] = now - since
    return now


def _calibrate(svc: bench_stack.Services, root: Any, clients: int) -> sizing.Rates:
    """Time this machine on a worker of its own (no tiers, the default pool)."""
    click.echo("--- calibration", err=True)
    site = bench_stack.new_site(svc, "calibrate")
    start = time.perf_counter()
    with bench_stack.worker("calibrate", "", site, root / "logs") as url:
        started = time.perf_counter() - start
        rates = sizing.calibrate(url, clients, started)
    click.echo(f"calibration: {rates.as_dict()}", err=True)
    return rates


def _size(
    spec: RunSpec,
    compares: dict[str, Compare],
    rates: sizing.Rates,
    only: tuple[str, ...],
    data: dict[str, Any],
) -> dict[str, budget.Costs]:
    """Measured turns per workload from the budget (or the spec), and the prediction; the
    predicted costs of each workload."""
    costs = {wl: budget.costs(c, rates) for wl, c in compares.items()}
    chat = compares.get("chat") or next(iter(compares.values()), None)
    restore_s = budget.restore_s(
        rates, spec.restore_lengths, spec.restore_repeats.restore, spec.restore_repeats.recompute
    )
    no_reuse_s = 0.0 if chat is None else budget.no_reuse_s(rates, chat, spec.no_reuse_requests)
    spent = sum(data["phase_seconds"].values())  # the model, the services, the calibration
    fixed = spent + restore_s + no_reuse_s
    if spec.budget_s:
        sizes = budget.fit(spec.budget_s, fixed, {w: (c, costs[w], configs_of(c, only)) for w, c in compares.items()})  # fmt: skip
    else:
        sizes = {wl: min(c.spec.measured, len(c.workload)) for wl, c in compares.items()}
    for wl, compare in compares.items():
        compare.resize(sizes[wl])
    data["budget"] = {
        "budget_s": spec.budget_s,
        # each phase once, so that their sum is the run's predicted length ("spent": the
        # seconds already gone when the run was sized)
        "predicted_s": {
            "spent": spent,
            "restore": restore_s,
            "no_reuse": no_reuse_s,
            **{
                wl: costs[wl].priming_s + costs[wl].configs_s(sizes[wl], configs_of(c, only))
                for wl, c in compares.items()
            },
        },
        "measured_turns": sizes,
    }
    return costs


def _refitter(
    spec: RunSpec,
    compares: dict[str, Compare],
    costs: dict[str, budget.Costs],
    only: tuple[str, ...],
    data: dict[str, Any],
    started: float,
    compare: Compare,
) -> Callable[[], None]:
    """What sizes ``compare``'s measured turns again once it is primed, from the seconds the
    budget really has left then (nothing, for a run without a budget)."""

    def refit() -> None:
        if not spec.budget_s:
            return
        names = list(compares)
        wl = compare.spec.workload
        later = [(compares[w], costs[w], configs_of(compares[w], only)) for w in names[names.index(wl) + 1 :]]  # fmt: skip
        now = time.perf_counter()
        left = spec.budget_s - (now - started)  # the fixed phases are done
        turns, seconds = budget.refit(left, (compare, costs[wl], configs_of(compare, only)), later)  # fmt: skip
        compare.resize(turns)
        compare.deadline = now + seconds
        ends_by = compare.deadline - started  # seconds into the run
        data["budget"]["measured_turns"][wl] = turns
        data["budget"].setdefault("ends_by_s", {})[wl] = ends_by
        data["workloads"][wl]["measured_turns"] = turns
        click.echo(f"=== {wl} primed: {turns} measured turns per configuration, "
                   f"done by {ends_by:.0f} s", err=True)  # fmt: skip

    return refit


def configs_of(compare: Compare, only: tuple[str, ...]) -> tuple[str, ...]:
    """The configurations of ``only`` that ``compare``'s workload is played in."""
    return tuple(c for c in only if c in compare.spec.configs)


#: what starting a configuration may raise: it is reported, and the run goes on without it
_START_FAILURES = (
    bench_stack.PartError,
    OSError,
    RuntimeError,
    subprocess.CalledProcessError,
    httpx.HTTPError,
)


def _play_workload(
    compare: Compare,
    only: tuple[str, ...],
    data: dict[str, Any],
    primed: Callable[[], None] = lambda: None,
) -> None:
    """Prime ``compare``'s workload, call ``primed``, start every configuration in ``only``
    beside the primer and play their measured turns in rounds, into ``data["workloads"]``
    (``config_seconds``: each one's start plus its own turns)."""
    wl = compare.spec.workload
    click.echo(f"=== {wl}: {len(compare.workload)} conversations, pool {compare.pool_tokens} tokens, "
               f"{compare.measured} measured turns per configuration", err=True)  # fmt: skip
    out: dict[str, Any] = {
        "conversations": len(compare.workload),
        "clients": compare.spec.clients,
        "measured_turns": compare.measured,
        "pool_tokens": compare.pool_tokens,
        "working_set_tokens": compare.working_set_tokens(),
        "idle_tokens": compare.idle_tokens(),
        "idle_over_pool": compare.idle_tokens() / compare.pool_tokens,
        "configs": {},
        "config_seconds": {},
    }
    data["workloads"][wl] = out  # filled as it goes: a stopped run still reports it
    only = configs_of(compare, only)
    with contextlib.ExitStack() as up:
        click.echo(f"--- {wl} host (priming)", err=True)
        start = time.perf_counter()
        try:
            served = [up.enter_context(compare.priming(primed))]
        except _START_FAILURES as exc:
            data["failures"][f"{wl}.host"] = str(exc)
            click.echo(f"{wl} host failed: {exc}", err=True)
            return  # nothing primed: the others have nothing to start from
        starts = {"host": time.perf_counter() - start}
        if compare.first_turns is not None:
            out["first_turns"] = compare.first_turns.as_dict()
            out["idle_tokens"] = compare.served_idle_tokens()  # as the server counted them
            out["idle_over_pool"] = out["idle_tokens"] / compare.pool_tokens
        for name in (c for c in only if c != "host"):
            click.echo(f"--- {wl} {name} (starting)", err=True)
            start = time.perf_counter()
            try:
                served.append(up.enter_context(compare.serving(name)))
            except _START_FAILURES as exc:
                data["failures"][f"{wl}.{name}"] = str(exc)
                click.echo(f"{wl} {name} failed: {exc}", err=True)
                continue
            starts[name] = time.perf_counter() - start
        served = [s for s in served if s.name in only]  # host primes even when not compared
        click.echo(f"--- {wl}: {', '.join(s.name for s in served)}, in rounds", err=True)

        def record(played: dict[str, Played]) -> None:  # each round: a stop keeps the rounds done
            for name, p in played.items():
                if p.failure:
                    data["failures"][f"{wl}.{name}"] = p.failure
                if p.results:
                    out["config_seconds"][name] = starts[name] + p.seconds
                    out["configs"][name] = p.summary().as_dict()

        played = compare.play(served, record)
        for name, p in played.items():
            s = p.summary()
            click.echo(f"{wl} {name}: {s.rps:.3f} req/s, TTFT p50 {s.ttft_p50:.2f}s, "
                       f"cached {s.cached_ratio:.0%}, errors {s.errors}", err=True)  # fmt: skip
        if unplayed := max((p.unplayed for p in played.values()), default=0):
            out["measured_turns"] = compare.measured - unplayed
            out["cut_at_deadline"] = (
                f"{compare.measured - unplayed} of the {compare.measured} turns sized were "
                "played: the next round would have ended past this workload's deadline"
            )
    out["configs"] = {c: out["configs"][c] for c in CONFIGS if c in out["configs"]}


def _restore_and_no_reuse(
    svc: bench_stack.Services, spec: RunSpec, kv: int, seed: int, root: Any, data: dict
) -> None:
    start = time.perf_counter()
    click.echo("--- restore vs resident", err=True)
    try:
        restore = restore_pair.measure(
            svc, spec.restore_lengths, kv, seed, root / "logs", spec.restore_repeats
        )
    except (bench_stack.PartError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        data["failures"]["restore"] = str(exc)
        click.echo(f"restore failed: {exc}", err=True)
        restore = {}
    data["restore"] = {str(n): v for n, v in restore.items()}
    data["floors"] = floors.for_restore(svc, kv, data["restore"])
    if "error" in data["floors"]:
        data["failures"]["floors"] = data["floors"]["error"]
    data["phase_seconds"]["restore"] = time.perf_counter() - start
    if not spec.no_reuse_requests:
        data["no_reuse"] = {}
        return
    start = time.perf_counter()
    fresh = conversations(spec.no_reuse_requests, WORKLOADS["chat"], seed + 1)
    data["no_reuse"], failure, l1 = play_pair(svc, fresh, spec.no_reuse_clients, kv, root / "logs")
    data["no_reuse_l1_tokens"] = l1
    if failure:
        data["failures"]["no_reuse"] = failure
    data["phase_seconds"]["no_reuse"] = time.perf_counter() - start


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def rewrite(data: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Verdicts and physics from ``data``'s measurements, then every output written again."""
    data["figures"] = figures(data)
    data["targets"] = verdicts(data)
    data["physics"] = physics(data)
    data.update({k: v for k, v in data["targets"].items()})  # the target figures, top level
    _write(data, name or ("multiturn_quick" if data["run"] == "quick" else "multiturn"))
    return data


def _full_run_stands(out: Path) -> bool:
    """Whether ``out`` holds a full run measured the way this module measures."""
    full = out / "multiturn.json"
    return full.exists() and "workloads" in json.loads(full.read_text())


#: output stem of the comparison run on a GPU, which docs/benchmarks.md shows beside the CPU one
GPU_STEM = "multiturn_cuda"


def _write(data: dict[str, Any], stem: str) -> None:
    """JSON, table and plots under docs/benchmarks/; docs/benchmarks.md from a full run, or
    from the quick run while no full run of this benchmark's shape (both workloads against
    ``infinite``) has been recorded, with the GPU run's section when one is recorded. A run
    given its own ``--name`` leaves docs/benchmarks.md alone."""
    out = DOCS / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    data["plots"] = [str(p.relative_to(DOCS)) for p in plots(data, out, stem)]
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    (out / f"{stem}.md").write_text(f"{provenance(data)}\n\n{markdown_table(data)}")
    if stem == "multiturn" or (stem == "multiturn_quick" and not _full_run_stands(out)):
        gpu = out / f"{GPU_STEM}.json"
        write_docs(
            data, DOCS / "benchmarks.md", json.loads(gpu.read_text()) if gpu.exists() else None
        )
