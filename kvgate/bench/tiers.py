"""``kvgate bench tiers``: restore speed of each tier against its raw device, and the ledger.

For each tier the same pages (SmolLM2-sized: 30 layers x 16 tokens x K/V x 3 heads x 64,
fp16 = 360 KiB) are restored through the real path — a tiered-store fetch into a landing:
ledger lookup, reads, checksum verification, with every page ending in a destination
buffer as restored pages end in the engine's pool (the NAS reads straight into it; RAM and
S3 bodies are copied there) — and read raw from the same device at the same concurrency,
as the issue defines it: ``memcpy`` for host RAM, plain file reads for the NAS, plain GETs
from the same S3 server for the object store. ``ratio`` is restore over that raw speed.
For the NAS and S3 the raw reads followed by a copy into the destination are timed too
(``raw_into_gbps``, ``ratio_like_for_like``): both sides then end with the same bytes in
the same place. The ledger is timed on batched upserts and on 256-key prefix lookups.
Postgres and S3 are the configured ones, else an embedded PostgreSQL and a SeaweedFS
started for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from kvgate.bench.output import cpu_name, publish, source_commit
from kvgate.bench.tiers_report import TARGETS, render
from kvgate.settings import Settings, load_settings
from kvgate.stack.postgres import create_pool, database
from kvgate.stack.seaweed import S3Endpoint, ensure_bucket, seaweed_s3
from migrations import runner
from tiering.codec import Block, encode_header, encoded_size, make_block
from tiering.cost import CostConfig, CostModel
from tiering.keys import Namespace
from tiering.landing import Landing
from tiering.ledger import NAS, OBJECT, Entry, Ledger
from tiering.store import StoreConfig, TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier, default_read_threads
from tiering.tiers.object import ObjectConfig, ObjectTier

PAGE_SHAPE = (30, 16, 2, 3, 64)
PAGE_TOKENS = 16
#: the NAS tier's threads (as a worker reads with), and the plain readers' it is compared with
NAS_THREADS = default_read_threads()


@dataclass(frozen=True)
class Plan:
    """How much to move: pages per chain, repetitions, ledger rows."""

    pages: int
    reps: int
    ledger_rows: int
    lookups: int
    concurrency: int = 32


QUICK = Plan(pages=64, reps=7, ledger_rows=50_000, lookups=300)
FULL = Plan(pages=256, reps=15, ledger_rows=400_000, lookups=2000)


def _chain(pages: int) -> tuple[Namespace, list[Block]]:
    ns = Namespace("bench", f"bench-{uuid.uuid4().hex}", "float16", PAGE_TOKENS)
    keys = ns.page_keys(np.arange(pages * PAGE_TOKENS) % 49152)
    rng = np.random.default_rng(0)
    blocks = [
        make_block(
            k, ns.digest, "float16", PAGE_SHAPE, rng.standard_normal(PAGE_SHAPE).astype(np.float16)
        )
        for k in keys
    ]
    return ns, blocks


async def _paired_gbps(
    n_bytes: int,
    reps: int,
    sides: Sequence[Callable[[], Awaitable[Any]]],
    reset: Callable[[], None],
) -> list[float]:
    """GB/s of each of ``sides`` (ours first), each the best of ``reps`` runs after a warm-up.

    The runs alternate so that every side sees the same background load (the machine may
    be shared); the best run is the least disturbed one, for all alike. ``reset`` runs
    untimed before each run of ours.
    """
    best = [float("inf")] * len(sides)
    for round_no in range(reps + 1):  # round 0 warms up and is not counted
        for side, fn in enumerate(sides):
            if side == 0:
                reset()
            start = time.perf_counter()
            await fn()
            elapsed = time.perf_counter() - start
            if round_no:
                best[side] = min(best[side], elapsed)
    return [n_bytes / b / 1e9 for b in best]


#: A raw side: the pages' payloads read the plain way (any buffers, one per page, in order).
RawRead = Callable[[], Awaitable[Sequence[Any]]]


def _fill(dst: np.ndarray, payloads: Sequence[Any]) -> None:
    """Copy the pages into the destination, as the engine copies restored pages into its pool."""
    for i, payload in enumerate(payloads):
        dst[i] = np.frombuffer(payload, dtype=np.uint8)


async def _bench_tier(
    tier: str, store: TieredStore, ns: Namespace, blocks: list[Block], raw: RawRead, plan: Plan,
    *, raw_is_copy: bool = False,
) -> dict[str, float]:  # fmt: skip
    """Restore against ``raw``; unless ``raw_is_copy`` (RAM, where reading is the copy), also
    against ``raw`` followed by the copy into the destination that restore ends with."""
    keys = [b.key for b in blocks]
    page_bytes = blocks[0].nbytes
    dst = np.empty((len(blocks), page_bytes), dtype=np.uint8)

    def reset() -> None:
        if tier != "host":
            store.host.clear()  # every run must come from the tier under test

    rows = [[memoryview(row)] for row in dst]

    async def restore() -> None:
        # the pages land in the destination as they land in the engine's pool: read
        # straight there where the tier can (the NAS), copied from its buffers otherwise
        into = Landing(ns.digest, blocks[0].dtype, blocks[0].shape, rows)
        got = await store.fetch(ns.digest, keys, PAGE_TOKENS, page_bytes=page_bytes, into=into)
        into.close()
        if got.tiers != [tier] * len(keys):
            raise click.ClickException(
                f"{tier}: restored {len(got.tiers)} of {len(keys)} pages from {set(got.tiers)}"
            )

    async def raw_into() -> None:
        _fill(dst, await raw())

    # RAM runs take milliseconds: many more of them to find undisturbed ones
    reps = plan.reps * (5 if tier == "host" else 1)
    sides = [restore, raw_into] if raw_is_copy else [restore, raw, raw_into]
    gbps = await _paired_gbps(page_bytes * len(blocks), reps, sides, reset)
    out = {"restore_gbps": gbps[0], "raw_gbps": gbps[1], "ratio": gbps[0] / gbps[1]}
    if not raw_is_copy:
        out |= {"raw_into_gbps": gbps[2], "ratio_like_for_like": gbps[0] / gbps[2]}
    return out


async def measure(pg_dsn: str, s3: ObjectConfig, nas_dir: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Every figure of one run."""
    pool = await create_pool(pg_dsn, min_size=2, max_size=plan.concurrency)
    conn = await pool.acquire()
    await runner.migrate(conn)
    await pool.release(conn)
    ledger = Ledger(pool)
    nas = NasTier(NasConfig(nas_dir, fsync=False, threads=NAS_THREADS))
    obj = await ObjectTier(s3).start()
    # fetch whatever the tier: this run measures restore speed, not the fetch-or-recompute choice
    cost = CostModel(
        CostConfig(prior_prefill_tokens_per_s=1.0, deadline_s={t: 600.0 for t in TARGETS})
    )
    # and a patient ledger: a lookup that times out would turn the run into a recompute
    patient = StoreConfig(ledger_timeout_s=30.0)
    store = TieredStore(
        HostTier(8 << 30), nas=nas, obj=obj, ledger=ledger, cost=cost, config=patient
    )
    out: dict[str, Any] = {}
    try:

        def entries(blocks: list[Block]) -> list[Entry]:
            return [Entry(b.namespace, b.key, encoded_size(b)) for b in blocks]

        say("host: memcpy vs fetch from RAM")
        ns, blocks = _chain(plan.pages)
        await store.host.put_many(blocks)
        src = np.stack([np.frombuffer(b.payload, dtype=np.uint8) for b in blocks])

        async def rows() -> np.ndarray:  # raw RAM is the copy into the destination itself
            return src

        out["host"] = await _bench_tier("host", store, ns, blocks, rows, plan, raw_is_copy=True)

        say("nas: plain file reads vs verified fetch")
        ns, blocks = _chain(plan.pages)
        await nas.put_many(blocks)
        await ledger.record(entries(blocks), NAS)
        paths = [nas.path(b.key) for b in blocks]
        readers = ThreadPoolExecutor(NAS_THREADS)
        loop = asyncio.get_running_loop()

        header = len(encode_header(blocks[0]))  # every page here has one shape and dtype

        def read(path: Path) -> memoryview:
            with open(path, "rb") as f:
                return memoryview(f.read())[header:]

        async def file_reads() -> list[memoryview]:
            return await asyncio.gather(*(loop.run_in_executor(readers, read, p) for p in paths))

        out["nas"] = await _bench_tier("nas", store, ns, blocks, file_reads, plan)
        readers.shutdown()

        say("object: plain GETs vs verified fetch")
        ns, blocks = _chain(plan.pages)
        await obj.put_many(blocks)
        await ledger.record(entries(blocks), OBJECT)
        sem = asyncio.Semaphore(s3.max_concurrency)

        async def get(key: bytes) -> memoryview:
            async with sem:
                body = await obj.reader.get(obj.object_name(key))
                if body is None:
                    raise RuntimeError(f"S3 lost {obj.object_name(key)} right after its PUT")
                return memoryview(body)[header:]

        async def plain_gets() -> list[memoryview]:
            return await asyncio.gather(*(get(b.key) for b in blocks))

        out["object"] = await _bench_tier("object", store, ns, blocks, plain_gets, plan)
        await obj.delete_many([b.key for b in blocks])

        say("ledger: batched upserts and 256-key prefix lookups")
        out["ledger"] = await _bench_ledger(ledger, plan)
    finally:
        await store.close(drain=False)
        await obj.close()
        nas.close()
        await pool.close()
    return out


async def _bench_ledger(ledger: Ledger, plan: Plan) -> dict[str, float]:
    ns = Namespace("bench", f"ledger-{uuid.uuid4().hex}", "float16", PAGE_TOKENS)
    rng = np.random.default_rng(1)
    keys = [bytes(k) for k in rng.integers(0, 256, (plan.ledger_rows, 32), dtype=np.uint8)]
    batch = 4096
    batches = [
        [Entry(ns.digest, k, 368_768) for k in keys[i : i + batch]]
        for i in range(0, len(keys), batch)
    ]
    # writers run side by side like the workers of a node (disjoint pages, as in production)
    sem = asyncio.Semaphore(4)

    async def upsert(b: list[Entry]) -> None:
        async with sem:
            await ledger.record(b, NAS)

    start = time.perf_counter()
    await asyncio.gather(*(upsert(b) for b in batches))
    upserts_per_s = len(keys) / (time.perf_counter() - start)

    chain = ns.page_keys(np.arange(256 * PAGE_TOKENS))
    await ledger.record([Entry(ns.digest, k, 368_768) for k in chain], NAS)
    lat = []
    for _ in range(plan.lookups):
        start = time.perf_counter()
        found = await ledger.prefix(ns.digest, chain)
        lat.append((time.perf_counter() - start) * 1e3)
    if len(found) != 256:
        raise click.ClickException(f"ledger lookup found {len(found)} of 256 pages")
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    await ledger.drop(keys + chain, NAS)
    return {
        "upserts_per_s": upserts_per_s,
        "lookup_p99_ms": p99,
        "lookup_p50_ms": lat[len(lat) // 2],
    }


@contextlib.contextmanager
def _backends(settings: Settings, scratch: Path) -> Iterator[tuple[str, ObjectConfig]]:
    """The configured Postgres and S3, or local ones started for this run."""
    url = settings.database_url.get_secret_value() if settings.database_url else None
    with database(url, scratch / "pg") as dsn, contextlib.ExitStack() as stack:
        if settings.s3_endpoint:
            endpoint = S3Endpoint(
                settings.s3_endpoint,
                settings.s3_access_key.get_secret_value(),
                settings.s3_secret_key.get_secret_value(),
                settings.s3_region,
            )
            ensure_bucket(endpoint, settings.s3_bucket)
        else:
            endpoint, _ = stack.enter_context(seaweed_s3(scratch / "s3", bucket=settings.s3_bucket))
        yield (
            dsn,
            ObjectConfig(
                endpoint_url=endpoint.url,
                bucket=settings.s3_bucket,
                prefix=f"bench-{uuid.uuid4().hex[:8]}/",
                access_key=endpoint.access_key,
                secret_key=endpoint.secret_key,
                region=endpoint.region,
                max_concurrency=32,
            ),
        )


@click.command()
@click.option(
    "--quick", is_flag=True, help="64 pages per tier, fewer repetitions (under a minute)."
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    help="Write the figures as JSON here (a written report gets them beside it anyway).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None,
    help="Markdown report path; default docs/benchmarks/tiers.md on a full run, none with --quick.",
)  # fmt: skip
def tiers(quick: bool, json_path: Path | None, out: Path | None) -> None:
    """Restore GB/s of host RAM, NAS and S3 vs their raw devices; ledger upserts/s and lookup p99."""
    plan = QUICK if quick else FULL
    settings = load_settings()
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-tiers-") as tmp:
        scratch = Path(tmp)
        with _backends(settings, scratch) as (dsn, s3):
            nas_dir = scratch / "nas"
            load_before = os.getloadavg()[0]
            figures = asyncio.run(
                measure(dsn, s3, nas_dir, plan, lambda m: click.echo(m, err=True))
            )
    # the machine may be shared: say how busy it was, the figures mean little without it
    figures["run"] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": cpu_name(),
        "commit": source_commit(),
        "pages": plan.pages,
        "reps": plan.reps,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg()[0],
    }
    publish(
        render(figures, page_bytes=int(np.prod(PAGE_SHAPE)) * 2),
        figures,
        out=out,
        json_path=json_path,
        default_out=Path("docs/benchmarks/tiers.md"),
        quick=quick,
    )
