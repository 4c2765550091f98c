"""Each tier against its real backend: host RAM, a directory, a SeaweedFS S3 server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import chain, flip_byte, namespace, object_config
from tiering.codec import encode
from tiering.landing import Landed, Landing
from tiering.tiers import nas as nas_module
from tiering.tiers.base import Tier
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectTier


@pytest.fixture(params=["host", "nas", "object"])
async def tier(request, nas_dir: Path, s3_server: S3Endpoint) -> AsyncIterator[Tier]:
    if request.param == "host":
        yield HostTier(1 << 30)
    elif request.param == "nas":
        nas = NasTier(NasConfig(nas_dir, fsync=False))
        yield nas
        nas.close()
    else:
        async with ObjectTier(object_config(s3_server)) as obj:
            yield obj


async def test_put_get_prefix_delete_round_trip(tier: Tier) -> None:
    blocks = chain(namespace(), 6)
    keys = [b.key for b in blocks]
    assert await tier.longest_prefix(keys) == 0
    await tier.put_many(blocks[:4])
    assert await tier.longest_prefix(keys) == 4
    got = await tier.get_many(keys)
    assert [bytes(g.payload) for g in got[:4] if g] == [bytes(b.payload) for b in blocks[:4]]
    assert got[4:] == [None, None]
    await tier.delete_many(keys[1:2])
    assert await tier.longest_prefix(keys) == 1
    stats = tier.stats()
    assert (stats.hits, stats.misses, stats.puts) == (4, 2, 4)
    assert stats.bytes_read == sum(b.nbytes for b in blocks[:4])


async def test_host_tier_evicts_least_recently_used_within_budget() -> None:
    blocks = chain(namespace(), 4, elems=100)  # 200 bytes each
    host = HostTier(600)
    await host.put_many(blocks[:3])
    assert host.get_now(blocks[0].key) is not None  # 0 is now most recent
    host.put_now(blocks[3])
    assert blocks[1].key not in host
    assert all(b.key in host for b in (blocks[0], blocks[2], blocks[3]))
    assert host.stats().used_bytes == 600


@pytest.mark.parametrize("threads", [1, 3])
async def test_host_tier_lands_each_page_in_its_place_on_its_copy_threads(threads: int) -> None:
    ns = namespace()
    blocks = chain(ns, 7)
    host = HostTier(1 << 30, copy_threads=threads)
    await host.put_many([b for i, b in enumerate(blocks) if i != 4])  # page 4 is not held
    memory = [bytearray(blocks[0].nbytes) for _ in blocks]
    landing = Landing(ns.digest, "float16", blocks[0].shape, [[memoryview(m)] for m in memory])
    at = [6, 5, 4, 3, 2, 1, 0]  # key i lands in page 6 - i
    got = await host.land([b.key for b in blocks], landing, at)
    assert got == [Landed.MISSING if i == 4 else Landed.LANDED for i in range(7)]
    for i, b in enumerate(blocks):
        expected = bytes(len(memory[0])) if i == 4 else bytes(b.payload)
        assert bytes(memory[6 - i]) == expected


async def test_nas_lays_out_sharded_files_and_counts_usage(nas_dir: Path) -> None:
    nas = NasTier(NasConfig(nas_dir, fsync=True))
    blocks = chain(namespace(), 3)
    await nas.put_many(blocks)
    path = nas.path(blocks[0].key)
    assert path.relative_to(nas_dir).parts[:2] == (
        blocks[0].key.hex()[:2],
        blocks[0].key.hex()[2:4],
    )
    assert path.read_bytes() == encode(blocks[0])
    assert await nas.usage() == (3, sum(len(encode(b)) for b in blocks))
    nas.close()


async def test_corrupt_nas_file_is_a_miss_deleted_and_counted(nas_dir: Path) -> None:
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    blocks = chain(namespace(), 2)
    await nas.put_many(blocks)
    path = nas.path(blocks[1].key)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(raw)
    got = await nas.get_many([b.key for b in blocks])
    assert got[0] is not None and got[1] is None
    assert not path.exists()
    assert nas.stats().corruptions == 1
    nas.close()


async def test_nas_batch_read_keeps_order_across_threads_slabs_misses_and_damage(
    nas_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nas_module, "GROUP_FILES", 2)  # several slabs per thread's run
    nas = NasTier(NasConfig(nas_dir, fsync=False, threads=2))
    blocks = chain(namespace(), 9)
    await nas.put_many(blocks[:3] + blocks[4:])  # page 3 is missing
    damaged = nas.path(blocks[5].key)
    flip_byte(damaged)
    truncated = nas.path(blocks[7].key)
    truncated.write_bytes(b"")
    got = await nas.get_many([b.key for b in blocks])
    present = [0, 1, 2, 4, 6, 8]
    assert [i for i, g in enumerate(got) if g is not None] == present
    assert [bytes(got[i].payload) for i in present] == [bytes(blocks[i].payload) for i in present]
    assert all(got[i].payload.readonly for i in present)  # the host tier keeps these buffers
    assert not damaged.exists() and not truncated.exists()
    stats = nas.stats()
    assert (stats.hits, stats.misses, stats.corruptions) == (6, 3, 2)
    assert await nas.get_many([]) == []
    nas.close()


async def test_nas_reads_never_queue_behind_writes(nas_dir: Path) -> None:
    """A restore's reads are answered while every write thread is busy (the write-behind
    of a burst of evictions must not delay a returning conversation)."""
    nas = NasTier(NasConfig(nas_dir, fsync=False, threads=2, write_threads=2))
    blocks = chain(namespace(), 3)
    await nas.put_many(blocks)
    release = threading.Event()
    held = [nas._writes.submit(release.wait, 30) for _ in range(2)]  # every write thread
    try:
        writing = asyncio.ensure_future(nas.put_many(chain(namespace("other"), 2)))
        got = await asyncio.wait_for(nas.get_many([b.key for b in blocks]), 10)
        assert [bytes(g.payload) for g in got] == [bytes(b.payload) for b in blocks]
        assert not writing.done()  # the writes did wait for a write thread
    finally:
        release.set()
    await writing
    assert all(h.result() for h in held)
    nas.close()


async def test_corrupt_s3_object_is_a_miss_deleted_and_counted(s3_server: S3Endpoint) -> None:
    async with ObjectTier(object_config(s3_server)) as obj:
        blocks = chain(namespace(), 2)
        await obj.put_many(blocks)
        raw = bytearray(encode(blocks[0]))
        raw[-3] ^= 0x01
        name = obj.object_name(blocks[0].key)
        await obj._client.put_object(Bucket="kvtest", Key=name, Body=bytes(raw))
        got = await obj.get_many([b.key for b in blocks])
        assert got[0] is None and got[1] is not None
        assert obj.stats().corruptions == 1
        assert await obj.longest_prefix([blocks[0].key]) == 0  # deleted, not just skipped


async def test_object_names_spread_over_hash_prefixes(s3_server: S3Endpoint) -> None:
    async with ObjectTier(object_config(s3_server)) as obj:
        blocks = chain(namespace(), 20)
        await obj.put_many(blocks)
        found = [e async for e in obj.scan()]
        assert {e.key for e in found} == {b.key for b in blocks}
        assert len({e.name.split("/")[1] for e in found}) > 10


async def test_object_prefix_with_reserved_characters_round_trips(s3_server: S3Endpoint) -> None:
    # GETs are signed on the percent-encoded path and must be sent as exactly that path
    cfg = object_config(s3_server)
    cfg = replace(cfg, prefix=cfg.prefix.rstrip("/") + ":a@b=c,d(e)/")
    async with ObjectTier(cfg) as obj:
        blocks = chain(namespace(), 2)
        await obj.put_many(blocks)
        got = await obj.get_many([b.key for b in blocks])
    assert [bytes(g.payload) for g in got if g is not None] == [bytes(b.payload) for b in blocks]


@pytest.mark.parametrize(("cpus", "threads"), [(None, 1), (1, 1), (2, 2), (64, 8)])
def test_nas_reads_on_one_thread_per_cpu_up_to_eight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpus: int | None, threads: int
) -> None:
    """Hot pages are read at the kernel's copy speed: more threads than CPUs only queue."""
    monkeypatch.setattr(nas_module.os, "cpu_count", lambda: cpus)
    assert NasConfig(tmp_path).threads == threads
    assert NasConfig(tmp_path, threads=3).threads == 3
