"""Broken backends become counted misses: read-only or full NAS, stopped S3, unreachable Postgres."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kvgate.stack.ports import free_port
from kvgate.stack.postgres import create_pool
from kvgate.stack.seaweed import seaweed_s3
from tests.support.tiering import chain, namespace, object_config, read_only
from tiering.codec import encoded_size
from tiering.ledger import OBJECT, Entry, Ledger
from tiering.store import StoreConfig, TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectTier

PAGE = 1024  # tokens per page as the cost model sees them: lenient deadlines


async def test_read_only_nas_counts_write_failures_and_keeps_serving(nas_dir: Path) -> None:
    ns = namespace()
    old, new = chain(ns, 2), chain(ns, 2, first_token=100)
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    await nas.put_many(old)
    store = await TieredStore(HostTier(1 << 30), nas=nas).start()
    with read_only(nas_dir):
        store.offer(new)
        await store.drain()
        assert store.counters["write_failed"] == 2
        assert store.failures.count("nas", "write") == 1
        assert store.host.prefix_now([b.key for b in new]) == 2  # served from RAM meanwhile
        got = await store.fetch(ns.digest, [b.key for b in old], PAGE, page_bytes=512)
        assert got.tiers == ["nas", "nas"]  # reads still work
    await store.close()
    nas.close()


async def test_stopped_s3_is_a_counted_miss(tmp_path: Path, pg_pool) -> None:
    ns = namespace()
    blocks = chain(ns, 3)
    keys = [b.key for b in blocks]
    ledger = Ledger(pg_pool)
    with seaweed_s3(tmp_path / "s3", bucket="kvtest") as (endpoint, proc):
        obj = await ObjectTier(object_config(endpoint, max_attempts=2, connect_timeout=0.5)).start()
        await obj.put_many(blocks)
        await ledger.record([Entry(b.namespace, b.key, encoded_size(b)) for b in blocks], OBJECT)
    assert proc.poll() is not None  # the server is gone
    store = await TieredStore(HostTier(1 << 30), obj=obj, ledger=ledger).start()
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=512)
    assert got.blocks == []
    assert store.failures.count("object") == 1  # a read error or an overrun deadline
    assert await ledger.prefix(ns.digest, keys) == [OBJECT] * 3  # an outage is not data loss
    await store.close()
    await obj.close()


async def test_unreachable_postgres_falls_back_to_the_nas_and_counts(nas_dir: Path) -> None:
    ns = namespace()
    blocks = chain(ns, 3)
    keys = [b.key for b in blocks]
    pool = await create_pool(f"postgresql://kv@127.0.0.1:{free_port()}/kv", min_size=0, max_size=1)
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    store = await TieredStore(
        HostTier(1 << 30), nas=nas, ledger=Ledger(pool), config=StoreConfig(touch_flush_s=0.05)
    ).start()
    store.offer(blocks)
    await store.drain()
    assert store.counters["written"] == 3  # data written even though its rows are not
    assert store.failures.count("ledger", "record") == 1
    store.host.clear()
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=512)
    assert got.tiers == ["nas"] * 3
    assert store.failures.count("ledger", "lookup") == 1
    await store.close()
    assert store.failures.count("ledger", "touch") >= 1
    assert store.ledger is not None and store.ledger.pending_touches == 3  # kept for a retry
    await pool.close()
    nas.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs as the full NAS needs root")
async def test_full_nas_counts_write_failures_and_leaves_no_partial_files(tmp_path: Path) -> None:
    full = tmp_path / "full-nas"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        nas = NasTier(NasConfig(full, fsync=False))
        store = await TieredStore(HostTier(1 << 30), nas=nas).start()
        blocks = chain(namespace(), 4, elems=16 << 10)  # 32 KiB pages: the third cannot fit
        store.offer(blocks)
        await store.drain()
        assert store.counters["write_failed"] >= 1
        assert store.failures.count("nas", "write") >= 1
        assert [e for e in nas.scan() if e.key is None] == []  # failed temporaries removed
        assert store.host.prefix_now([b.key for b in blocks]) == 4  # still served from RAM
        await store.close()
        nas.close()
    finally:
        subprocess.run(["umount", str(full)], check=True)
