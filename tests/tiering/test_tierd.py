"""tierd on real Postgres, NAS directory and S3: watermarks, restore, quotas, orphans, concurrency.

Each test gets a database of its own (``fresh_database``): tierd reconciles the whole ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from kvgate.stack.postgres import create_pool
from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import chain, fresh_database, namespace, object_config
from tiering.codec import encode, encoded_size
from tiering.ledger import NAS, OBJECT, Entry, Ledger
from tiering.store import TieredStore
from tiering.tierd import Tierd, TierdConfig
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectTier


@pytest.fixture
async def fresh_db(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn) as name:
        yield name


@pytest.fixture
async def env(pg_dsn: str, fresh_db: str, nas_dir: Path, s3_server: S3Endpoint):
    pool = await create_pool(pg_dsn, database=fresh_db, min_size=1, max_size=4)
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    async with ObjectTier(object_config(s3_server)) as obj:
        yield pool, nas, obj
    nas.close()
    await pool.close()


async def _spill(pool, nas, obj, blocks) -> None:
    """Spill ``blocks`` the way a worker does: host RAM, then write-behind to NAS + ledger."""
    store = await TieredStore(HostTier(1 << 30), nas=nas, obj=obj, ledger=Ledger(pool)).start()
    store.offer(blocks)
    await store.close()


async def test_watermark_demotes_lru_pages_to_s3_and_they_restore(env) -> None:
    pool, nas, obj = env
    ns = namespace()
    blocks = chain(ns, 20)
    keys = [b.key for b in blocks]
    await _spill(pool, nas, obj, blocks)
    page = encoded_size(blocks[0])
    # the first 5 pages were used recently: they must be the ones that stay
    ledger = Ledger(pool)
    ledger.touch(keys[:5])
    await ledger.flush_touches()

    tierd = Tierd(pool, nas, obj, TierdConfig(nas_high_bytes=8 * page, nas_low_bytes=5 * page))
    report = await tierd.run_pass()
    assert (report.demoted, report.nas_deleted) == (15, 15)
    files, used = await nas.usage()
    assert used <= 8 * page and files == 5
    assert report.nas_bytes == used
    assert await nas.longest_prefix(keys[:5]) == 5

    fresh = await TieredStore(HostTier(1 << 30), nas=nas, obj=obj, ledger=Ledger(pool)).start()
    got = await fresh.fetch(ns.digest, keys, 1024, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["nas"] * 5 + ["object"] * 15
    assert [bytes(b.payload) for b in got.blocks] == [bytes(b.payload) for b in blocks]
    await fresh.close()


async def test_crossing_the_high_watermark_starts_a_pass_before_the_interval(env) -> None:
    pool, nas, obj = env
    blocks = chain(namespace(), 20)
    page = encoded_size(blocks[0])
    config = TierdConfig(
        nas_high_bytes=8 * page, nas_low_bytes=5 * page, interval_s=3600, watermark_check_s=0.05
    )
    passes: asyncio.Queue = asyncio.Queue()
    stop = asyncio.Event()
    task = asyncio.create_task(Tierd(pool, nas, obj, config).run_forever(stop, passes.put_nowait))
    assert (await asyncio.wait_for(passes.get(), 60)).demoted == 0  # the first: nothing there
    await _spill(pool, nas, obj, blocks)
    # the next pass by the clock is an hour away: only the watermark check can start this one
    assert (await asyncio.wait_for(passes.get(), 60)).demoted > 0
    stop.set()
    await task


async def test_concurrent_tierds_never_demote_a_page_twice(env, pg_dsn: str, fresh_db: str) -> None:
    pool, nas, obj = env
    blocks = chain(namespace(), 30)
    await _spill(pool, nas, obj, blocks)
    page = encoded_size(blocks[0])
    cfg = TierdConfig(nas_high_bytes=10 * page, nas_low_bytes=10 * page, batch_pages=4)
    pools = [await create_pool(pg_dsn, database=fresh_db, min_size=1, max_size=2) for _ in range(3)]
    objs = [ObjectTier(obj.config) for _ in pools]
    tierds = [Tierd(p, nas, o, cfg) for p, o in zip(pools, objs, strict=True)]
    reports = await asyncio.gather(*(t.run_pass() for t in tierds))
    assert sum(r.demoted for r in reports) == 20
    assert sum(o.stats().puts for o in objs) == 20  # no object uploaded twice
    assert any(r.skipped for r in reports) or sum(r.demoted > 0 for r in reports) == 1
    assert len([e async for e in obj.scan()]) == 20
    for p, o in zip(pools, objs, strict=True):
        await o.close()
        await p.close()


async def test_reconcile_collects_orphans_and_repairs_rows_both_ways(env) -> None:
    pool, nas, obj = env
    ns = namespace()
    blocks = chain(ns, 4)
    ledger = Ledger(pool)
    entries = [Entry(b.namespace, b.key, encoded_size(b)) for b in blocks]
    await nas.put_many(blocks[:2])  # block 0: data + row; block 1: data, no row
    await obj.put_many(blocks[2:3])  # block 2: S3 data, no row
    await ledger.record([entries[0], entries[3]], NAS)  # block 3: row, no data
    await ledger.record([entries[3]], OBJECT)
    old = 1_000_000_000  # mtime far in the past: beyond any grace period
    os.utime(nas.path(blocks[1].key), (old, old))
    leftover = nas.path(blocks[0].key).parent / ".dead.1.tmp"
    leftover.write_bytes(encode(blocks[0])[:10])
    os.utime(leftover, (old, old))

    tierd = Tierd(pool, nas, obj, TierdConfig(orphan_grace_s=3600))
    report = await tierd.run_pass()
    assert not nas.path(blocks[1].key).exists() and not leftover.exists()
    assert nas.path(blocks[0].key).exists()
    assert report.rows_repaired == 2  # block 3 on both tiers
    assert await ledger.held([b.key for b in blocks], NAS | OBJECT) == {blocks[0].key}
    # the S3 orphan is younger than the grace period: kept until a pass with no grace
    assert len([e async for e in obj.scan()]) == 1
    no_grace = Tierd(pool, nas, obj, TierdConfig(orphan_grace_s=0, reconcile_interval_s=3600))
    await no_grace.run_pass()
    assert [e async for e in obj.scan()] == []
    await obj.put_many(blocks[2:3])  # a new orphan: left to the next reconciliation
    await no_grace.run_pass()
    assert len([e async for e in obj.scan()]) == 1


async def test_quota_retention_and_object_capacity(env) -> None:
    pool, nas, obj = env
    big, small = namespace("big"), namespace("small")
    big_blocks, small_blocks = chain(big, 10), chain(small, 2)
    await _spill(pool, nas, obj, big_blocks + small_blocks)
    page = encoded_size(big_blocks[0])
    ledger = Ledger(pool)
    ledger.touch(b.key for b in big_blocks[6:])  # the newest pages of "big" are the hot ones
    await ledger.flush_touches()

    report = await Tierd(pool, nas, obj, TierdConfig(namespace_quota_bytes=4 * page)).run_pass()
    assert report.over_quota == 6
    assert len(await ledger.prefix(big.digest, [b.key for b in big_blocks])) == 0  # coldest first
    assert await ledger.held([b.key for b in big_blocks], NAS) == {b.key for b in big_blocks[6:]}

    cfg = TierdConfig(nas_high_bytes=1, nas_low_bytes=0, object_max_bytes=3 * page)
    report = await Tierd(pool, nas, obj, cfg).run_pass()
    assert report.demoted == 6 and report.object_deleted == 3
    assert report.nas_bytes == 0 and report.object_bytes == 3 * page

    report = await Tierd(pool, nas, obj, TierdConfig(retention_s=1e-6)).run_pass()
    assert report.expired == 3
    assert report.object_bytes == 0 and [e async for e in obj.scan()] == []


async def test_kvgate_tierd_once_runs_a_pass_from_settings(
    env, pg_dsn: str, fresh_db: str, nas_dir: Path, s3_server: S3Endpoint
) -> None:
    pool, nas, obj = env
    blocks = chain(namespace(), 6)
    await _spill(pool, nas, obj, blocks)
    page = encoded_size(blocks[0])
    dsn = urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{fresh_db}"))
    env_vars = {
        **os.environ,
        "DATABASE_URL": dsn,
        "KVGATE_NAS_PATH": str(nas_dir),
        "KVGATE_S3_ENDPOINT": s3_server.url,
        "KVGATE_S3_ACCESS_KEY": s3_server.access_key,
        "KVGATE_S3_SECRET_KEY": s3_server.secret_key,
        "KVGATE_S3_BUCKET": "kvtest",
        "KVGATE_S3_PREFIX": obj.config.prefix,
        "KVGATE_TIER_NAS_HIGH_BYTES": str(4 * page),
        "KVGATE_TIER_NAS_LOW_BYTES": str(2 * page),
        "KVGATE_CONFIG": str(nas_dir / "absent.toml"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvgate",
        "tierd",
        "--once",
        env=env_vars,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["demoted"] == 4 and report["nas_bytes"] == 2 * page
    assert len([e async for e in obj.scan()]) == 4


async def test_demote_checks_an_object_bit_before_deleting_the_last_nas_copy(env) -> None:
    pool, nas, obj = env
    ns = namespace()
    blocks = chain(ns, 3)
    keys = [b.key for b in blocks]
    entries = [Entry(b.namespace, b.key, encoded_size(b)) for b in blocks]
    ledger = Ledger(pool)
    await nas.put_many(blocks[:2])
    await obj.put_many(blocks[:2])
    await ledger.record(entries[:2], NAS | OBJECT)  # restored from S3, then spilled again
    cfg = TierdConfig(nas_high_bytes=2 * encoded_size(blocks[0]), reconcile_interval_s=3600)
    tierd = Tierd(pool, nas, obj, cfg)
    assert (await tierd.run_pass()).nas_deleted == 0  # reconciled; at the watermark
    # page 1's object goes while its bit stays (a GET found it corrupt and deleted it, and
    # the repair did not reach the ledger): the NAS copy is the only one left
    await obj.delete_many(keys[1:2])
    await nas.put_many(blocks[2:])
    await ledger.record(entries[2:], NAS)

    report = await tierd.run_pass()
    assert report.nas_deleted == 3 and report.demoted == 2  # page 0's object was there
    assert [b is not None for b in await obj.get_many(keys)] == [True] * 3
    assert await ledger.prefix(ns.digest, keys) == [OBJECT] * 3
    assert not any(nas.path(k).exists() for k in keys)


async def test_retention_without_an_object_store_ends_and_keeps_object_rows(env) -> None:
    pool, nas, obj = env
    ns = namespace()
    blocks = chain(ns, 6)
    keys = [b.key for b in blocks]
    entries = [Entry(b.namespace, b.key, encoded_size(b)) for b in blocks]
    ledger = Ledger(pool)
    await obj.put_many(blocks[:4])
    await ledger.record(entries[:4], OBJECT)  # more object-only rows than one batch
    await nas.put_many(blocks[3:])
    await ledger.record(entries[3:], NAS)  # page 3 on both tiers

    nas_only = Tierd(pool, nas, None, TierdConfig(retention_s=1e-6, batch_pages=2))
    async with asyncio.timeout(60):  # the loop used to fetch the object rows forever
        report = await nas_only.run_pass()
    assert report.expired == 3 and not report.errors
    assert not any(nas.path(k).exists() for k in keys)
    assert await ledger.held(keys, OBJECT) == set(keys[:4])  # their data is out of reach
    assert await ledger.held(keys, NAS) == set()
    assert [b is not None for b in await obj.get_many(keys)] == [True] * 4 + [False] * 2
    assert not (await Tierd(pool, nas, obj, TierdConfig()).run_pass()).skipped  # lock let go


async def test_demotion_makes_room_in_the_object_store_before_it_uploads(env) -> None:
    """With the object store full, a demotion deletes its coldest objects first: at no
    upload does the store hold more than its limit (the soak saw 70 MiB in a 64 MiB store
    in 45% of its samples when the trim came after)."""
    pool, nas, obj = env
    ns = namespace()
    blocks = chain(ns, 8)
    page = encoded_size(blocks[0])
    ledger = Ledger(pool)
    await _spill(pool, nas, obj, blocks[:4])
    cfg = TierdConfig(nas_high_bytes=1, nas_low_bytes=0, object_max_bytes=4 * page)
    assert (await Tierd(pool, nas, obj, cfg).run_pass()).object_bytes == 4 * page  # full
    await _spill(pool, nas, obj, blocks[4:7])

    held_at_upload: list[int] = []
    put_many = obj.put_many

    async def watched(batch):
        held_at_upload.append(await ledger.usage(OBJECT) + sum(encoded_size(b) for b in batch))
        await put_many(batch)

    obj.put_many = watched
    report = await Tierd(pool, nas, obj, cfg).run_pass()
    assert held_at_upload == [4 * page]  # room for three, then three uploaded
    assert report.demoted == 3 and report.object_deleted == 3
    held = await ledger.held([b.key for b in blocks], OBJECT)
    assert len(held) == 4 and {b.key for b in blocks[4:7]} <= held  # the newest kept
