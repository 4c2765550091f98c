"""What each fault did to the requests, judged against the targets, and the Markdown of it.

Per fault: the requests that started while it was the current phase, how the failed ones
ended, ``wrong_outputs`` (answers that are not the reference's), ``usage_lost`` (requests
the client saw succeed that have no usage row), ``usage_wrong`` (a row whose tokens are not
those the client was told), ``hung_requests`` and ``recover_s`` (from the fault's end to
the end of the first success that started after it). Failures are *expected* only for
requests in flight on a killed worker or gateway replica while it died (from the signal
until the process is gone: the kernel takes tens of milliseconds to tear it down), in
whichever phase the request started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kvgate.bench.faults.load import Request
from kvgate.bench.faults.matrix import Fault
from protocol.tiers import TIERS

#: a fault must be recovered from within this many seconds of its end
RECOVERY_TARGET_S = 30.0
OUTCOMES = ("clean", "cut", "refused", "hang")


@dataclass
class Phase:
    """When one fault's phase ran (``time.monotonic()``), and what injecting it noted."""

    fault: Fault
    start: float
    injected: float = 0.0
    ended: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    restart_s: float | None = None
    #: why it was not run (empty when it was)
    skipped: str = ""
    #: the gateway URL of a killed replica, to tell its requests from the other's
    killed_gateway: str = ""
    #: the workers' tier counters (corruptions, failures) that moved during the phase
    counters: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UsageRow:
    """The columns of a usage row the check reads."""

    worker: str
    status: int
    prompt_tokens: int
    completion_tokens: int


def judge(
    phase: Phase,
    requests: list[Request],
    reference: dict[tuple[str, int], str],
    usage: dict[str, UsageRow],
    kills: list[Phase],
) -> dict[str, Any]:
    """The figures of one phase and whether it met every target; ``kills`` are the phases
    (of the whole run) that killed a worker or a gateway replica."""
    name = phase.fault.name
    if phase.skipped:
        return {"fault": name, "what": phase.fault.what, "skipped": phase.skipped}
    mine = [r for r in requests if r.phase == name]
    ok = [r for r in mine if r.ok]
    failed = [r for r in mine if not r.ok]
    expected = [r for r in failed if _expected(r, kills, usage)]
    wrong = [r for r in ok if r.text != reference.get((r.cid, r.turn))]
    lost = [r for r in ok if r.request_id not in usage]
    usage_wrong = [
        r
        for r in ok
        if r.request_id in usage
        and (usage[r.request_id].prompt_tokens, usage[r.request_id].completion_tokens)
        != (r.prompt_tokens, r.completion_tokens)
    ]
    after = [r.end for r in ok if r.start >= phase.ended]
    recover_s = min(after) - phase.ended if after else None
    back = [r.end for r in ok if r.start >= phase.ended and _serves(phase, r, usage)]
    figures = {
        "fault": name,
        "what": phase.fault.what,
        "requests": len(mine),
        "succeeded": len(ok),
        "failed": len(failed),
        "failed_by_outcome": {o: sum(r.outcome == o for r in failed) for o in OUTCOMES},
        "failed_in_flight_on_killed": len(expected),
        "unexpected_failures": len(failed) - len(expected),
        "hung_requests": sum(r.outcome == "hang" for r in mine),
        "wrong_outputs": len(wrong),
        "usage_lost": len(lost),
        "usage_wrong": len(usage_wrong),
        "recover_s": None if recover_s is None else round(recover_s, 2),
        "back_s": round(min(back) - phase.ended, 2) if back else None,
        "fault_s": round(phase.ended - phase.injected, 2),
        "tier_counters": phase.counters,
        "restart_s": phase.restart_s,
        "skipped_replicas": sum(r.skipped_replicas for r in mine),
        "cached_tokens_by_tier": _by_tier(ok),
        "notes": phase.notes,
        "errors": sorted({r.error for r in failed})[:8],
        "failures": [_failure(phase, r, r in expected) for r in failed[:20]],
        "wrong_examples": [_wrong(r, reference) for r in wrong[:3]],
    }
    figures["met"] = (
        not wrong
        and not lost
        and not usage_wrong
        and figures["hung_requests"] == 0
        and figures["unexpected_failures"] == 0
        and recover_s is not None
        and recover_s <= RECOVERY_TARGET_S
    )
    return figures


def _by_tier(requests: list[Request]) -> dict[str, int]:
    """Cached prompt tokens of ``requests`` by the tier they came back from."""
    total: dict[str, int] = {}
    for req in requests:
        for tier, tokens in req.cached_by_tier.items():
            total[tier] = total.get(tier, 0) + tokens
    return total


def _serves(phase: Phase, req: Request, usage: dict[str, UsageRow]) -> bool:
    """Whether ``req`` was served by what the fault hit (``Fault.back``)."""
    back = phase.fault.back
    if back in TIERS:
        return req.cached_by_tier.get(back, 0) > 0
    if phase.killed_gateway:
        return req.gateway == phase.killed_gateway
    row = usage.get(req.request_id)
    return bool(back) and row is not None and row.worker == back


def _failure(phase: Phase, req: Request, expected: bool) -> dict[str, Any]:
    """One failed request, its times relative to the injection."""
    return {
        "start_s": round(req.start - phase.injected, 3),
        "end_s": round(req.end - phase.injected, 3),
        "gateway": req.gateway,
        "outcome": req.outcome,
        "expected": expected,
        "error": req.error[:160],
    }


def _wrong(req: Request, reference: dict[tuple[str, int], str]) -> dict[str, Any]:
    want = reference.get((req.cid, req.turn)) or ""
    return {"cid": req.cid, "turn": req.turn, "got": req.text[:80], "want": want[:80]}


def _expected(req: Request, kills: list[Phase], usage: dict[str, UsageRow]) -> bool:
    """A failure a kill excuses: in flight on a killed gateway replica or worker while it
    died, in this phase or another (a slow request can outlive its phase)."""
    for kill in kills:
        died = kill.injected + kill.notes.get("died_after_s", 0.0)
        if not req.start <= died or req.end < kill.injected:
            continue
        if kill.killed_gateway and req.gateway == kill.killed_gateway:
            return True
        row = usage.get(req.request_id)
        if row is not None and row.worker == kill.fault.kills:
            return True
    return False


def markdown(data: dict[str, Any]) -> str:
    """The report: how the run was made, the table, and a paragraph per fault."""
    lines = [
        "# Reliability: the fault matrix",
        "",
        f"`kvgate bench faults{' --quick' if data['quick'] else ''}` on {data['cpu']} "
        f"({os.cpu_count()} CPUs), commit `{data['commit']}`, model `{data['model']}`; "
        f"{data['clients']} clients replaying {data['conversations']} conversations with "
        f"greedy decoding through two gateway replicas, two workers, tierd, Postgres, "
        f"SeaweedFS behind the fault proxy and a NAS ({data['nas']}). A request that takes "
        f"more than {data['hang_s']:g} s is hung. Wall time {data['wall_s'] / 60:.1f} min.",
        "",
        "| fault | requests | failed (clean / cut / refused) | expected | hung | wrong "
        "outputs | usage lost | recovered in | hit part back in | target met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in data["faults"]:
        if "skipped" in f:
            lines.append(f"| {f['fault']} | not run: {f['skipped']} |||||||||")
            continue
        by = f["failed_by_outcome"]
        recover = "never" if f["recover_s"] is None else f"{f['recover_s']:.1f} s"
        back = "—" if f["back_s"] is None else f"{f['back_s']:.1f} s"
        lines.append(
            f"| {f['fault']} | {f['requests']} | {f['failed']} ({by['clean']} / {by['cut']} / "
            f"{by['refused']}) | {f['failed_in_flight_on_killed']} | {f['hung_requests']} | "
            f"{f['wrong_outputs']} | {f['usage_lost']} | {recover} | {back} | "
            f"{'yes' if f['met'] else '**no**'} |"
        )
    lines += ["", "## The faults", ""]
    for f in data["faults"]:
        lines.append(f"- **{f['fault']}**: {f['what']}.")
        if "skipped" in f:
            continue
        extra = ", ".join(f"{k} {v}" for k, v in f["notes"].items())
        tiers = ", ".join(f"{t} {n}" for t, n in f["cached_tokens_by_tier"].items())
        extra += f"{', ' if extra else ''}cached tokens by tier: {tiers or 'none'}"
        moved = ", ".join(f"{k} +{v:g}" for k, v in f["tier_counters"].items())
        extra += f"; worker tier counters: {moved or 'none moved'}"
        if f["restart_s"] is not None:
            extra += f"{', ' if extra else ''}restarted in {f['restart_s']:.1f} s"
        if extra:
            lines.append(f"  Noted: {extra}.")
        for error in f["errors"]:
            lines.append(f"  Failure seen: `{error[:160]}`")
    return "\n".join(lines) + "\n"
