"""Restore vs resident: the TTFT of one turn whose history sits in L1, L2, L3, L4 or nowhere.

For each history length a fresh site (database, NAS directory, S3 prefix) and three
workers in turn, each with a device pool that holds one such history and no more:

1. worker A, which hands pages down on eviction only (write-through off, so that a flush
   of L1 leaves nothing anywhere), prefills the turn (``recompute``), answers it again
   from L1 (``resident``), then prefills a second history of the same length, which
   evicts the first to A's host RAM and, written behind, to the NAS; once the ledger
   shows those pages on the NAS and A's pool is flushed, the turn is sent again and
   comes back from A's host RAM (``host``);
2. worker B, a fresh process sharing the NAS, answers it from the NAS (``nas``);
3. one ``tierd --once`` pass with a NAS watermark of one byte demotes every page to the
   object store and deletes it from the NAS; worker C, fresh again, answers from S3
   (``object``; left out when the run has no object store).

Each source is asked :data:`REPEATS` times and reported by its median sample: a serving
worker restores with warm buffers, and a fresh process's first touch of its memory is a
start-up cost, not a restore cost. Between two asks L1 is flushed (without offloading), so
each ask comes from the source again; B and C keep no host RAM, so that a restored page
is not promoted there and the next ask reads the NAS or S3 again.

Each restore from host RAM, the NAS or S3 is paired with the same turn asked again at
once, resident in that worker's L1 (``resident_host``, ``resident_nas``,
``resident_object``): the ratio of a tier to resident
is taken within one process, minutes from A's resident turns on another. On a 2-core VM
the same resident turn took 0.19-0.25 s in one minute and 0.38 s in another, a spread
wider than what the NAS adds to it.

Every answer's usage says which tier served the cached tokens; the report keeps it, so a
figure labelled ``nas`` is known to come from the NAS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from kvgate.bench.multiturn import sizing, stack
from kvgate.bench.multiturn.driver import Result, Target, model_of, send
from kvgate.bench.multiturn.metrics import percentile
from kvgate.bench.multiturn.workload import single_history
from kvgate.stack.process import kvgate_argv

SOURCES: tuple[str, ...] = ("resident", "host", "nas", "object", "recompute")
TIERS = "host,nas,object"
#: pool room beyond the history: the new message, the chat template, the answer
POOL_SLACK_TOKENS = 400
#: asks per source; the median one is reported. Five, not three: a fresh worker's first two
#: restores from S3 took 1.07-1.30 s and 0.46-0.98 s against 0.33-0.46 s for the third
#: (first-touch memory, new connections), so a median of three could still be a cold one.
REPEATS = 5
DRAIN_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Repeats:
    """Asks per source: the restores, and the recompute (a quick run on a slow machine asks
    it once: at 4k tokens it is a minute of prefill, and no other figure depends on its
    median)."""

    restore: int = REPEATS
    recompute: int = REPEATS


@dataclass
class Sample:
    """One measured turn."""

    ttft: float
    prompt_tokens: int
    cached_tokens: int
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @classmethod
    def of(cls, r: Result) -> Sample:
        return cls(r.ttft, r.prompt_tokens, r.cached_tokens, dict(r.cached_by_tier), r.error)


def _messages(length: int, seed: int) -> list[dict[str, str]]:
    conv = single_history(length, seed)
    first, follow = conv.turns
    return [
        {"role": "system", "content": conv.system},
        {"role": "user", "content": first.user + "\n\n" + follow.user},
    ]


#: a first request on each fresh worker, sharing no page with any history: one-off costs
#: (allocator, kernel selection) must not be charged to the first measured source
_WARM_UP = [{"role": "user", "content": "warm up"}]


async def _ask(url: str, messages: list[dict[str, str]]) -> Sample:
    async with httpx.AsyncClient(timeout=1800) as client:
        target = Target(url)
        result = Result("restore", 0, 0.0)
        await send(client, target, await model_of(client, target), messages, 1, result)
        return Sample.of(result)


def measure_length(svc: stack.Services, length: int, kv_bytes: int, seed: int, log_dir: Path, repeats: Repeats) -> dict[str, Sample]:  # fmt: skip
    """The samples of each source in :data:`SOURCES` for a history of ``length`` tokens."""
    page = sizing.PAGE_TOKENS
    pool_tokens = -(-(length + POOL_SLACK_TOKENS) // page) * page
    site = stack.new_site(
        svc,
        f"restore{length}",
        worker_kv_pool_bytes=pool_tokens * kv_bytes,
        worker_page_size=page,
        tier_host_bytes=4 * pool_tokens * kv_bytes,
    )
    history = _messages(length, seed)
    out: dict[str, Sample] = {}
    logs = log_dir / f"restore-{length}"
    tiers = TIERS if svc.s3 is not None else "host,nas"
    # A hands pages down on eviction only (write-through off): with write-through, each
    # "recompute" ask after the first would come back from the host RAM its predecessor
    # filled, and the flushes between asks would no longer make them cold.
    write_back = replace(site, env={**site.env, "KVGATE_TIER_WRITE_THROUGH": "false"})
    with stack.worker("restore-a", tiers, write_back, logs) as url:
        asyncio.run(_ask(url, _WARM_UP))
        out["recompute"] = _typical(url, history, flush=True, n=repeats.recompute)
        if out["recompute"].cached_tokens:
            raise RuntimeError(
                f"the recompute turn found {out['recompute'].cached_tokens} tokens cached "
                f"({out['recompute'].cached_by_tier}): it would time a restore, not a prefill"
            )
        out["resident"] = _typical(url, history, flush=False, n=repeats.restore)
        # A prompt that needs every page of the pool evicts the whole history (a page left
        # in L1 would be missing from the NAS, and a prefix that misses its first page is
        # no prefix): L2 now, the NAS once written behind.
        overhead = out["recompute"].prompt_tokens - length  # message, template
        asyncio.run(_ask(url, _messages(pool_tokens - overhead - page // 2, seed + 1)))
        _wait_for_nas(site, out["recompute"].prompt_tokens // page)
        # Flushing drops the evicting prompt's pages (no offload), so the turn is charged
        # for fetching from host RAM only, not for first evicting a pool's worth of other KV.
        out["host"], out["resident_host"] = _paired(url, history, repeats.restore)
    no_l2 = replace(site, env={**site.env, "KVGATE_TIER_HOST_BYTES": "0"})
    with stack.worker("restore-b", tiers, no_l2, logs) as url:
        asyncio.run(_ask(url, _WARM_UP))
        out["nas"], out["resident_nas"] = _paired(url, history, repeats.restore)
    if svc.s3 is None:  # a run without an object store: L4 is not measured
        return out
    demote_everything(site, logs)
    with stack.worker("restore-c", TIERS, no_l2, logs) as url:
        asyncio.run(_ask(url, _WARM_UP))
        out["object"], out["resident_object"] = _paired(url, history, repeats.restore)
    return out


def _typical(url: str, messages: list[dict[str, str]], *, flush: bool, n: int) -> Sample:
    """The median of ``n`` asks, each after flushing L1 when ``flush``."""
    samples = []
    for _ in range(n):
        if flush:
            _flush(url)
        samples.append(asyncio.run(_ask(url, messages)))
    return _median(samples)


def _paired(url: str, messages: list[dict[str, str]], n: int) -> tuple[Sample, Sample]:
    """The median of ``n`` asks after flushing L1 (restored from the tier below), and of the
    ask made right after each (resident in L1), on the same worker."""
    restored, resident = [], []
    for _ in range(n):
        _flush(url)
        restored.append(asyncio.run(_ask(url, messages)))
        resident.append(asyncio.run(_ask(url, messages)))
    return _median(restored), _median(resident)


def _flush(url: str) -> None:
    httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()


def _median(samples: list[Sample]) -> Sample:
    """The sample nearest the median TTFT (a real sample, with its usage)."""
    median = percentile([s.ttft for s in samples], 50)
    return min(samples, key=lambda s: abs(s.ttft - median))


def _wait_for_nas(site: stack.Site, pages: int) -> None:
    """Poll the ledger until ``pages`` pages are recorded on the NAS (write-behind done)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while stack.ledger_pages(site)[0] < pages:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the NAS did not receive {pages} pages within {DRAIN_TIMEOUT_S:.0f} s; "
                f"see the worker log under {site.nas}"
            )
        time.sleep(0.5)


def demote_everything(site: stack.Site, log_dir: Path) -> None:
    """One tierd pass that moves every NAS page to the object store."""
    env = {**os.environ, **site.env, "KVGATE_TIER_NAS_HIGH_BYTES": "1", "KVGATE_TIER_NAS_LOW_BYTES": "0"}  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "tierd-once.log", "ab") as log:
        subprocess.run(kvgate_argv("tierd", "--once"), env=env, stdout=log, stderr=log, check=True)


def measure(
    svc: stack.Services,
    lengths: tuple[int, ...],
    kv_bytes: int,
    seed: int,
    log_dir: Path,
    repeats: Repeats | None = None,
) -> dict[int, dict[str, dict]]:
    """``{length: {source: sample as a dict}}`` for every length."""
    every = repeats or Repeats()
    return {
        n: {k: asdict(v) for k, v in measure_length(svc, n, kv_bytes, seed, log_dir, every).items()}
        for n in lengths
    }
