"""``kvgate bench faults``: the fault matrix — one fault at a time under steady load.

It starts the stack (:mod:`kvgate.bench.faults.stack`), plays every conversation once
fault-free (the reference), then keeps the clients replaying them
(:mod:`kvgate.bench.faults.load`) while it runs one phase per fault
(:mod:`kvgate.bench.faults.matrix`): a lead-in of steady load, the fault, its end, and a
tail that lasts until the first success after the end (at least ``tail_s`` seconds after
the fault's end or the restart of what it killed, at most :data:`TAIL_MAX_S`). After the last phase the gateways are stopped (they flush their usage
rows) and every success is looked up in the ``usage`` table. The figures are judged by
:mod:`kvgate.bench.faults.report`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import asyncpg
import click

from kvgate.bench.faults.load import Load, Request
from kvgate.bench.faults.matrix import FAULTS, HELD_S, Fault
from kvgate.bench.faults.report import Phase, UsageRow, judge, markdown
from kvgate.bench.faults.stack import GATEWAYS, WORKERS, FaultStack, Sizes, fault_stack
from kvgate.bench.multiturn.compare import alternating_sessions
from kvgate.bench.multiturn.environment import kv_bytes_per_token
from kvgate.bench.multiturn.workload import conversations
from kvgate.bench.output import cpu_name, publish, source_commit
from kvgate.bench.soak import SHAPE  # small conversations: what breaks, not throughput
from kvgate.models.registry import served_model_id

#: the longest a phase waits after its fault for the first success
TAIL_MAX_S = 90.0


@dataclass(frozen=True)
class Spec:
    """How big a run is."""

    #: KVGATE_WORKER_MODEL of the workers (None: the default model)
    model: str | None
    conversations: int
    clients: int
    #: seconds of steady load before a fault, and at least after it
    lead_s: float
    tail_s: float


QUICK = Spec("tiny-random", conversations=8, clients=4, lead_s=8.0, tail_s=12.0)
FULL = Spec(None, conversations=12, clients=4, lead_s=15.0, tail_s=25.0)


def sizes_for(convs_tokens: int, kv_bytes: int) -> Sizes:
    """Tiers small against the working set, so that pages move through every one of them:
    a worker's pool holds a few requests, its host RAM less than a tenth of the set, the
    NAS half of it (tierd demotes the rest), the object store all of it twice."""
    return Sizes(
        kv_pool=3072 * kv_bytes,
        host=max(512, convs_tokens // 10) * kv_bytes,
        nas_high=max(1024, convs_tokens // 2) * kv_bytes,
        object_max=2 * convs_tokens * kv_bytes,
    )


def run_phase(stack: FaultStack, load: Load, fault: Fault, spec: Spec) -> Phase:
    """One fault: lead-in, inject, hold, heal, tail."""
    phase = Phase(fault, start=time.monotonic())
    if fault.needs_mount and not stack.nas.mounted:
        phase.skipped = f"the NAS could not be mounted as a tmpfs here ({stack.nas.why_not})"
        return phase
    click.echo(f"--- {fault.name}: {fault.what}", err=True)
    load.phase = fault.name
    time.sleep(spec.lead_s)  # steady load before the fault: the schedule of the experiment
    if fault.kills in GATEWAYS:
        phase.killed_gateway = stack.gateways[fault.kills].probe_url.rsplit("/", 1)[0]
    counters = stack.worker_counters()
    phase.notes = fault.moment(stack) if fault.moment else {}
    phase.injected = time.monotonic()
    try:
        phase.notes |= fault.inject(stack)
        if fault.held:
            time.sleep(HELD_S)  # the fault lasts this long
    finally:
        if fault.held and fault.heal is not None:
            fault.heal(stack)
        phase.ended = time.monotonic()
    if not fault.held and fault.heal is not None:
        fault.heal(stack)  # a killed process started again
        phase.restart_s = round(time.monotonic() - phase.ended, 2)
    _tail(load, phase.ended, time.monotonic() + spec.tail_s)
    phase.counters = moved(counters, stack.worker_counters())
    return phase


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How far each counter went up (a worker restarted meanwhile counts from zero)."""
    out = {}
    for name, value in after.items():
        step = value - before.get(name, 0.0)
        step = value if step < 0 else step
        if step:
            out[name] = step
    return out


def _tail(load: Load, ended: float, not_before: float) -> None:
    """Keep the load on until a success started after ``ended`` has finished, and at least
    until ``not_before`` (so that a restarted part has time to serve), at most
    :data:`TAIL_MAX_S` after ``ended``."""
    while (now := time.monotonic()) < max(ended + TAIL_MAX_S, not_before):
        recovered = any(r.ok and r.start >= ended for r in load.since(ended))
        if recovered and now >= not_before:
            return
        time.sleep(0.5)  # the schedule: checking the load's progress twice a second


def usage_rows(dsn: str, requests: list[Request]) -> dict[str, UsageRow]:
    """The usage rows of ``requests``, by request id."""

    async def fetch() -> dict[str, UsageRow]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "SELECT request_id, worker, status, prompt_tokens, completion_tokens"
                " FROM usage WHERE request_id = ANY($1::text[])",
                [r.request_id for r in requests if r.request_id],
            )
        finally:
            await conn.close()
        return {
            r["request_id"]: UsageRow(
                r["worker"], r["status"], r["prompt_tokens"], r["completion_tokens"]
            )
            for r in rows
        }

    return asyncio.run(fetch())


@click.command()
@click.option(
    "--quick", is_flag=True, help="Tiny random model, fewer conversations, shorter phases."
)
@click.option(
    "--model", default=None, help="KVGATE_WORKER_MODEL [default: SmolLM2; --quick: tiny-random]."
)
@click.option("--faults", "only", default="", help="Comma list of faults to run (default: all).")
@click.option(
    "--hang-timeout",
    "hang_s",
    type=float,
    default=90.0,
    show_default=True,
    help="Seconds after which a request that has not ended counts as hung.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Write the Markdown report here.")
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Write the figures here."
)
@click.option("--keep", is_flag=True, help="Keep the run's directory (logs, data) afterwards.")
def faults(quick: bool, model: str | None, only: str, hang_s: float, out: Path | None,
           json_path: Path | None, keep: bool) -> None:  # fmt: skip
    """Inject faults one at a time into a running stack under load; measure what is lost.

    A full run writes docs/benchmarks/faults.md and faults.json; a quick one writes only
    where --out/--json say."""
    spec = QUICK if quick else FULL
    if model:
        spec = Spec(model, spec.conversations, spec.clients, spec.lead_s, spec.tail_s)
    chosen = [f for f in FAULTS if not only or f.name in only.split(",")]
    if unknown := set(filter(None, only.split(","))) - {f.name for f in FAULTS}:
        raise click.UsageError(
            f"unknown faults {sorted(unknown)}; pick from {[f.name for f in FAULTS]}"
        )
    started = time.monotonic()
    # this process sizes the tiers by the model; unset is the default model (SmolLM2)
    os.environ.pop("KVGATE_WORKER_MODEL", None)
    if spec.model:
        os.environ["KVGATE_WORKER_MODEL"] = spec.model
    convs = conversations(spec.conversations, SHAPE, seed=23)
    tokens = sum(c.tokens(len(c.turns)) for c in convs)
    sizes = sizes_for(tokens, kv_bytes_per_token())
    root = Path(tempfile.mkdtemp(prefix="kvgate-faults-"))
    try:
        with fault_stack(root, spec.model, sizes) as stack:
            load = Load(
                stack.gateway_urls, stack.api_key, stack.model, convs, clients=spec.clients,
                hang_s=hang_s, headers_for=alternating_sessions(stack.model, WORKERS),
            )  # fmt: skip
            click.echo(f"stack up in {root}; reference play", err=True)
            load.play_reference()
            load.start()
            try:
                phases = [run_phase(stack, load, fault, spec) for fault in chosen]
            finally:
                load.stop()
            for gateway in stack.gateways.values():
                gateway.stop()  # a stopping gateway writes the usage rows it holds
            usage = usage_rows(stack.site.dsn, load.requests)
            nas = "a tmpfs" if stack.nas.mounted else f"a plain directory ({stack.nas.why_not})"
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    kills = [p for p in phases if p.fault.kills in (*WORKERS, *GATEWAYS) and not p.skipped]
    figures = {
        "quick": quick, "model": served_model_id(spec.model), "cpu": cpu_name(), "commit": source_commit(),
        "spec": asdict(spec), "sizes": asdict(sizes), "conversations": len(convs),
        "clients": spec.clients, "hang_s": hang_s, "nas": nas, "held_s": HELD_S,
        "reference_requests": sum(r.phase == "reference" for r in load.requests),
        "faults": [judge(p, load.requests, load.reference, usage, kills) for p in phases],
        "wall_s": time.monotonic() - started,
    }  # fmt: skip
    figures["met"] = all(f.get("met", True) for f in figures["faults"])
    default = Path("docs") / "benchmarks" / "faults.md"
    publish(markdown(figures), figures, out=out, json_path=json_path, default_out=default,
            quick=quick)  # fmt: skip
