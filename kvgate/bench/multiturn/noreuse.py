"""The no-reuse pair: what tiering costs when it cannot help, measured interleaved.

Every request is the first turn of a fresh conversation, so no tier ever serves a page and
tiering is pure cost: keying and copying every request's pages, host RAM, the NAS
write-behind and its ledger rows. One worker with every tier (and the ledger; no tierd)
plays both sides: ``off`` with its tiers detached and ``on`` with them attached
(``/hicache/storage-backend``, as SGLang switches its storage backend at runtime), its L1
flushed before every wave. One process, because two processes are two draws of memory: with
both sides of a two-worker pair untiered, the second-started decoded 3% slower and the
"overhead" came out at 0.020, twice the target, for no tiering at all.

The requests are played in waves of one request per client, each wave once with the tiers
off and once on, in the order off·on, on·off, off·on, …, so that whatever drifts on a
shared machine (load, page cache, clocks) weighs on both alike. A wave with the tiers on
ends only once its write-behind has written every page it was given, so the wave pays for
the background work it caused. The first wave of each side is warm-up. Requests/s of a side
is its measured requests over the sum of its waves' seconds; the overhead figure is the
median over waves of each wave's own on/off ratio (see
:mod:`kvgate.bench.multiturn.report`), which one stalled wave cannot move. The caller sizes
the worker's L1 to hold a whole wave: with less, a preempted request's pages would come
back from host RAM with the tiers on and be recomputed with them off, and the pair would
measure that help instead of the cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import click
import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.multiturn import stack
from kvgate.bench.multiturn.driver import Plan, Result, Target, run
from kvgate.bench.multiturn.metrics import Summary, summarize
from kvgate.bench.multiturn.workload import Conversation
from protocol.fields import STORAGE_BACKEND_PATH, TIERS_BACKEND
from protocol.metric_names import TIER_WRITE_QUEUE

#: per request of a wave, tokens beyond its words: the chat template's role markers, the
#: last partial page, the page of headroom admission keeps per request
SLACK_TOKENS = 64
#: how long a wave's write-behind may take to empty before the run gives up on it
DRAIN_TIMEOUT_S = 300.0
#: how often the write-behind's queue is read while a wave waits for it: the wait is
#: counted against tiering, so a coarser poll would add up to its interval to every wave
#: (waits measured 0.027-0.034 s a wave with this poll, 0.024-0.033 s with 0.02 s)
DRAIN_POLL_S = 0.002


@dataclass(frozen=True)
class Side:
    """One side of the pair: the worker, and whether its tiers are attached."""

    label: str
    url: str
    #: tiers attached (its waves also wait for the write-behind to empty)
    tiered: bool


def wave_count(requests: int, clients: int) -> int:
    """The number of waves ``requests`` make; ValueError unless they are whole waves of
    ``clients``, an odd number of them, at least 3: one warm-up, then an even number
    measured, so that each side goes first as often as second."""
    n, rest = divmod(requests, clients)
    if rest or n < 3 or n % 2 == 0:
        raise ValueError(
            f"the no-reuse pair plays whole waves of {clients} requests, an odd number of "
            f"them and at least 3 (one warm-up, then pairs); {requests} requests make "
            f"{requests / clients:g}: give {clients * 3}, {clients * 5}, {clients * 7}, …"
        )
    return n


def waves(convs: Sequence[Conversation], clients: int) -> list[list[Conversation]]:
    """``convs`` cut into waves of ``clients`` (see :func:`wave_count`); the first is the
    warm-up."""
    n = wave_count(len(convs), clients)
    return [list(convs[i * clients : (i + 1) * clients]) for i in range(n)]


def order(n_waves: int, sides: tuple[Side, Side]) -> list[tuple[int, Side]]:
    """(wave, side) in play order: each wave on both sides, the side going first
    alternating from wave to wave (ABBA), so each side is first as often as second."""
    a, b = sides
    return [(w, s) for w in range(n_waves) for s in ((a, b) if w % 2 == 0 else (b, a))]


def write_queue(metrics_text: str) -> float:
    """The write-behind's unwritten pages as a worker's /metrics text reports them."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == TIER_WRITE_QUEUE:
                return sample.value
    raise ValueError(f"the worker's /metrics has no {TIER_WRITE_QUEUE}: is it tiered?")


async def drained(url: str) -> None:
    """Return once the worker at ``url`` has written behind everything it was given."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    async with httpx.AsyncClient(timeout=10.0) as client:
        while True:
            response = await client.get(f"{url}/metrics")
            response.raise_for_status()
            if write_queue(response.text) == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: write-behind not empty after {DRAIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(DRAIN_POLL_S)


async def _set_up(side: Side) -> None:
    """Empty the worker's L1 (nothing offloaded), then attach or detach its tiers."""
    async with httpx.AsyncClient(base_url=side.url, timeout=60.0) as client:
        (await client.post("/flush_cache")).raise_for_status()
        route, attach = STORAGE_BACKEND_PATH, {"hicache_storage_backend": TIERS_BACKEND}
        switched = await (client.put(route, json=attach) if side.tiered else client.delete(route))
        switched.raise_for_status()
        if (switched.json()["hicache_storage_backend"] is not None) != side.tiered:
            raise RuntimeError(f"{side.url}: the tiers did not switch: {switched.text}")


async def _wave(side: Side, w: int, convs: list[Conversation]) -> tuple[list[Result], float, float]:
    """Wave ``w`` on ``side`` (its L1 emptied and its tiers switched first): its results,
    the seconds it then waited for the write-behind to empty, and its seconds in all.

    Each side's wave is a cache namespace of its own: both sides play the same conversations
    on one worker, and their shared system prompt must not come back from the tiers an
    earlier wave filled (requests of one wave share it in L1, on both sides alike)."""
    await _set_up(side)
    start = time.perf_counter()
    clients = len(convs)
    plan = Plan(clients=clients, active=clients, warmup=clients if w == 0 else 0)
    target = Target(side.url, cache_salt=f"noreuse-{side.label}-{w}")
    results = await run(target, convs, plan, progress=False)
    drain = 0.0
    if side.tiered:
        drain_start = time.perf_counter()
        await drained(side.url)
        drain = time.perf_counter() - drain_start
    return results, drain, time.perf_counter() - start


def play(sides: tuple[Side, Side], convs: Sequence[Conversation], clients: int) -> dict[str, dict]:
    """Play the interleaved waves; per side its summary (requests/s over the sum of its
    measured waves' seconds), every wave's seconds (``wave_seconds``, warm-up first) and
    how many of them it spent waiting for its write-behind after the requests ended
    (``drain_seconds``, zeros where it does not write behind)."""
    cut = waves(convs, clients)
    results: dict[str, list[Result]] = {s.label: [] for s in sides}
    seconds: dict[str, list[float]] = {s.label: [] for s in sides}
    drains: dict[str, list[float]] = {s.label: [] for s in sides}
    for w, side in order(len(cut), sides):
        played, drain, took = asyncio.run(_wave(side, w, cut[w]))
        results[side.label] += played
        seconds[side.label].append(took)
        drains[side.label].append(drain)
        kind = "warm-up" if w == 0 else "measured"
        click.echo(
            f"wave {w + 1}/{len(cut)}, tiering {side.label}: {seconds[side.label][-1]:.1f} s ({kind})",
            err=True,
        )
    out = {}
    for s in sides:
        summary: Summary = summarize(results[s.label], seconds=sum(seconds[s.label][1:]))
        out[s.label] = summary.as_dict() | {
            "wave_seconds": seconds[s.label],
            "drain_seconds": drains[s.label],
        }
    return out


def l1_tokens(convs: Sequence[Conversation], clients: int) -> int:
    """An L1 that holds the largest wave whole.

    With less, a wave's requests preempt one another, and a preempted request's pages come
    back from host RAM when tiering is on but are recomputed when it is off: the pair would
    measure that help, not the price of tiering when it cannot help. (Older waves' pages are
    flushed before each wave, on both sides alike.)
    """
    return max(sum(c.tokens(1) + SLACK_TOKENS for c in wave) for wave in waves(convs, clients))


def play_pair(
    svc: stack.Services, convs: Sequence[Conversation], clients: int, kv_bytes: int, log_dir: Path
) -> tuple[dict[str, dict], str, int]:
    """One worker with every tier on a fresh site, ``convs``' first turns played in
    interleaved waves of ``clients`` with its tiers detached and attached; returns
    (figures, failure or "", the L1 in tokens)."""
    click.echo("--- no reuse, tiering off vs on, interleaved", err=True)
    first = [replace(c, turns=c.turns[:1]) for c in convs]
    l1 = l1_tokens(first, clients)
    every_tier = "host,nas,object" if svc.s3 is not None else "host,nas"
    sizes = {"tier_host_bytes": l1 * kv_bytes, "worker_kv_pool_bytes": l1 * kv_bytes}
    logs = log_dir / "no-reuse"
    try:
        site = stack.new_site(svc, "noreuse", **sizes)
        with stack.worker("noreuse", every_tier, site, logs) as url:
            sides = (Side("off", url, tiered=False), Side("on", url, tiered=True))
            return play(sides, first, clients), "", l1
    except (stack.PartError, OSError, RuntimeError, ValueError, httpx.HTTPError) as exc:
        click.echo(f"no reuse failed: {exc}", err=True)
        return {}, str(exc), l1
