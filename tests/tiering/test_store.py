"""The tiered store over real tiers: spill, lookup, fetch with promotion, repair, drops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest

from kvgate.stack.seaweed import S3Endpoint
from tests.support.tiering import chain, flip_byte, namespace, object_config
from tiering.codec import Block, encoded_size
from tiering.cost import CostConfig, CostModel
from tiering.keys import Namespace
from tiering.landing import Landed, Landing
from tiering.ledger import NAS, OBJECT, Entry, Ledger
from tiering.store import StoreConfig, TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectTier

PAGE = 1024  # tokens per page as the cost model sees them: fetching pays, deadlines are lenient


@pytest.fixture
async def parts(
    nas_dir: Path, s3_server: S3Endpoint, pg_pool
) -> AsyncIterator[tuple[NasTier, ObjectTier, Ledger]]:
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    async with ObjectTier(object_config(s3_server)) as obj:
        yield nas, obj, Ledger(pg_pool)
    nas.close()


def _store(parts, **config) -> TieredStore:
    nas, obj, ledger = parts
    return TieredStore(
        HostTier(1 << 30), nas=nas, obj=obj, ledger=ledger, config=StoreConfig(**config)
    )


def _entries(blocks) -> list[Entry]:
    return [Entry(b.namespace, b.key, encoded_size(b)) for b in blocks]


async def test_offered_pages_reach_nas_and_ledger_and_another_worker_fetches_them(parts) -> None:
    ns = namespace()
    blocks = chain(ns, 8)
    keys = [b.key for b in blocks]
    first = await _store(parts).start()
    first.offer(blocks)
    assert await first.lookup(ns.digest, keys) == ["host"] * 8
    await first.close()
    assert await parts[2].prefix(ns.digest, keys) == [NAS] * 8

    second = await _store(parts).start()  # empty host RAM: a different worker
    got = await second.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["nas"] * 8
    assert [bytes(b.payload) for b in got.blocks] == [bytes(b.payload) for b in blocks]
    assert await second.lookup(ns.digest, keys) == ["host"] * 8  # promoted
    assert second.counters["hit_nas"] == 8
    await second.close()
    row = await parts[2].pool.fetchrow("SELECT hits FROM kv_ledger WHERE key = $1", keys[0])
    assert row["hits"] == 1  # the touch was flushed on close


async def test_host_ram_keeps_owned_pages_as_given_and_copies_the_others(parts) -> None:
    ns = namespace()
    owned, lent = chain(ns, 2), chain(ns, 2, first_token=2 * ns.page_size)
    store = await _store(parts).start()
    store.offer(owned, owned=True)
    store.offer(lent)
    for block in (*owned, *lent):
        np.frombuffer(block.payload, np.uint8)[:] ^= 0xFF  # the caller writes again
    kept = [store.host.get_now(b.key) for b in (*owned, *lent)]
    assert [bytes(k.payload) for k in kept[:2]] == [bytes(b.payload) for b in owned]
    assert [bytes(k.payload) for k in kept[2:]] != [bytes(b.payload) for b in lent]
    await store.close()


async def test_fetch_spans_tiers_in_order_and_stops_at_first_gap(parts) -> None:
    nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 6)
    keys = [b.key for b in blocks]
    await nas.put_many(blocks[:2])
    await ledger.record(_entries(blocks[:2]), NAS)
    await obj.put_many(blocks[2:4])
    await ledger.record(_entries(blocks[2:4]), OBJECT)
    await obj.put_many(blocks[5:])  # page 4 is missing everywhere
    await ledger.record(_entries(blocks[5:]), OBJECT)
    store = await _store(parts).start()
    store.host.put_now(blocks[0])
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["host", "nas", "object", "object"]
    await store.close()


async def test_corrupt_nas_page_is_a_miss_deleted_counted_and_repaired(parts) -> None:
    nas, _obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 3)
    keys = [b.key for b in blocks]
    await nas.put_many(blocks)
    await ledger.record(_entries(blocks), NAS)
    path = nas.path(keys[1])
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(raw)
    store = await _store(parts).start()
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["nas"]
    assert not path.exists()
    assert store.stats()["tiers"]["nas"].corruptions == 1
    assert store.counters["repaired_nas"] == 1
    assert await ledger.held(keys, NAS) == {keys[0], keys[2]}
    await store.close()


async def test_ledger_row_whose_data_is_gone_is_a_miss_and_repaired(parts) -> None:
    _nas, _obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 2)
    await ledger.record(_entries(blocks), OBJECT)  # rows without data
    store = await _store(parts).start()
    got = await store.fetch(ns.digest, [b.key for b in blocks], PAGE, page_bytes=512)
    assert got.blocks == []
    assert await ledger.prefix(ns.digest, [b.key for b in blocks]) == []
    await store.close()


async def test_full_write_queue_drops_and_counts_instead_of_waiting(parts) -> None:
    ns = namespace()
    blocks = chain(ns, 10)
    store = _store(parts, write_queue_pages=3)  # not started: nothing drains the queue
    store.offer(blocks)
    assert store.counters["write_dropped"] == 7
    assert store.host.prefix_now([b.key for b in blocks]) == 10  # serving still has them
    assert store.stats()["write_queue"] == 3  # the dropped ones are not waited for
    await store.start()
    await store.drain()
    assert store.stats()["write_queue"] == 0
    await store.close()
    assert store.counters["written"] == 3


async def test_pages_that_would_take_the_nas_over_its_cap_stay_in_host_ram_only(parts) -> None:
    ledger = parts[2]
    ns = namespace()
    blocks = chain(ns, 8)
    keys = [b.key for b in blocks]
    size = _entries(blocks)[0].size
    base = await ledger.usage(NAS)  # other tests' pages share the ledger
    store = await _store(parts, nas_max_bytes=base + 3 * size, nas_usage_refresh_s=0.0).start()
    store.offer(blocks)
    await store.drain()
    assert (store.counters["written"], store.counters["write_full"]) == (3, 5)
    assert await ledger.usage(NAS) == base + 3 * size
    assert await ledger.prefix(ns.digest, keys) == [NAS] * 3
    assert store.host.prefix_now(keys) == 8  # serving still has every page

    await ledger.drop(keys[:2], NAS)  # tierd demoted two pages: two more fit
    store.offer(blocks[3:])
    await store.drain()
    assert (store.counters["written"], store.counters["write_full"]) == (5, 8)
    assert await ledger.usage(NAS) == base + 3 * size
    await store.close()


async def test_cost_model_skips_tiers_slower_than_recompute(parts) -> None:
    nas, _obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 4)
    await nas.put_many(blocks)
    await ledger.record(_entries(blocks), NAS)
    nas_, obj, _ = parts
    fast_prefill = CostModel(CostConfig(prior_prefill_tokens_per_s=1e12))
    store = TieredStore(HostTier(1 << 30), nas=nas_, obj=obj, ledger=ledger, cost=fast_prefill)
    await store.start()
    store.host.put_now(blocks[0])
    got = await store.fetch(ns.digest, [b.key for b in blocks], PAGE, page_bytes=512)
    assert got.tiers == ["host"]
    assert store.counters["skipped_nas"] == 3
    await store.close()


async def test_a_fetch_started_at_admission_lands_its_pages_when_the_request_is_scheduled(
    parts,
) -> None:
    nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 6)
    keys = [b.key for b in blocks]
    await nas.put_many(blocks[:3])
    await ledger.record(_entries(blocks[:3]), NAS)
    await obj.put_many(blocks[3:])
    await ledger.record(_entries(blocks[3:]), OBJECT)
    store = await _store(parts).start()
    store.fetch_early(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes)
    await asyncio.gather(*(e.task for e in store._early.values()))
    # the pages are read: gone from both tiers now, the scheduled fetch still lands them
    await nas.delete_many(keys[:3])
    await obj.delete_many(keys[3:])
    views = [[memoryview(bytearray(b.nbytes))] for b in blocks]
    landing = Landing(ns.digest, "float16", blocks[0].shape, views)
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=landing)
    landing.close()
    assert got.tiers == ["nas"] * 3 + ["object"] * 3  # the tier each page was read from
    assert [bytes(v[0]) for v in views] == [bytes(b.payload) for b in blocks]
    assert store.counters["early_fetch_used"] == 1
    assert store.host.prefix_now(keys) == 0  # wanted once: host RAM was left alone
    # it serves one fetch: the next reads the tiers again, and finds the pages gone
    again = Landing(ns.digest, "float16", blocks[0].shape, views)
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=again)
    again.close()
    assert got.tiers == [] and store.counters["early_fetch_used"] == 1
    await store.close()


async def test_fetch_overrunning_its_deadline_is_abandoned_and_counted(parts) -> None:
    nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 4, elems=1 << 20)  # 2 MiB pages: no read finishes in a microsecond
    await nas.put_many(blocks)
    await ledger.record(_entries(blocks), NAS)
    impatient = CostModel(CostConfig(deadline_s={"host": 1.0, "nas": 1e-6, "object": 1e-6}))
    store = TieredStore(HostTier(1 << 30), nas=nas, obj=obj, ledger=ledger, cost=impatient)
    await store.start()
    store.host.put_now(blocks[0])
    got = await store.fetch(ns.digest, [b.key for b in blocks], PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["host"]  # the rest is left to recompute
    assert store.failures.count("nas", "deadline") == 1
    assert await ledger.held([b.key for b in blocks], NAS) == {
        b.key for b in blocks
    }  # not "repaired"
    await store.close()


async def test_a_page_leaving_host_ram_during_the_lookup_ends_the_prefix(parts) -> None:
    nas, obj, pool_ledger = parts

    class EvictingLedger(Ledger):
        """The real ledger, but host RAM drops page 1 while it answers (memory pressure)."""

        async def prefix(self, namespace: bytes, keys) -> list[int]:  # type: ignore[no-untyped-def]
            await store.host.delete_many([blocks[1].key])
            return await super().prefix(namespace, keys)

    ledger = EvictingLedger(pool_ledger.pool)
    ns = namespace()
    blocks = chain(ns, 6)
    await nas.put_many(blocks[3:])
    await ledger.record(_entries(blocks[3:]), NAS)
    store = await TieredStore(HostTier(1 << 30), nas=nas, obj=obj, ledger=ledger).start()
    for block in blocks[:3]:
        store.host.put_now(block)
    got = await store.fetch(ns.digest, [b.key for b in blocks], PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["host"]  # never a gap, never a page taken for lost
    assert store.counters["repaired_nas"] == 0
    assert await ledger.held([b.key for b in blocks], NAS) == {b.key for b in blocks[3:]}
    await store.close()


async def test_fetch_into_a_landing_reads_every_tier_in_place(parts) -> None:
    nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 12)
    keys = [b.key for b in blocks]
    await nas.put_many(blocks[3:8])
    await ledger.record(_entries(blocks[3:8]), NAS)
    await obj.put_many(blocks[8:])
    await ledger.record(_entries(blocks[8:]), OBJECT)
    # page 9 is on the NAS too, but the ledger does not know (a write whose row is still
    # to come): the early NAS read may take it, and it lands once, from one tier
    await nas.put_many([blocks[9]])
    store = _store(parts)
    for block in blocks[:3]:
        store.host.put_now(block)
    views = [[memoryview(bytearray(b.nbytes))] for b in blocks]
    landing = Landing(ns.digest, "float16", blocks[0].shape, views)

    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=landing)
    landing.close()
    assert got.blocks == []
    assert got.tiers[:9] == ["host"] * 3 + ["nas"] * 5 + ["object"]
    assert got.tiers[9] in ("nas", "object") and got.tiers[10:] == ["object"] * 2
    assert [bytes(v[0]) for v in views] == [bytes(b.payload) for b in blocks]
    assert store.counters["repaired_object"] == 0  # page 9 was read, not lost
    assert await ledger.prefix(ns.digest, keys[8:]) == [OBJECT] * 4
    # the pages are the caller's now: nothing was promoted into host RAM
    assert await store.lookup(ns.digest, keys) == ["host"] * 3 + ["nas"] * 5 + ["object"] * 4
    await store.close()


class WatchedLanding(Landing):
    """A real landing that says when one page's claim is taken and given up, and can keep
    the claiming thread inside the claim (a read that is slow to finish) until ``go``."""

    def __init__(self, *args: Any, page: int, hold: bool = False) -> None:
        super().__init__(*args)
        self.page, self.hold = page, hold
        self.claimed, self.released, self.go = (threading.Event() for _ in range(3))

    def claim(self, i: int) -> list[memoryview] | None:
        parts = super().claim(i)
        if i == self.page and parts is not None:
            self.claimed.set()
            if self.hold:
                self.go.wait(60)
        return parts

    def release(self, i: int, *args: Any, **kw: Any) -> None:
        super().release(i, *args, **kw)
        if i == self.page:
            self.released.set()


class LedgerAfter(Ledger):
    """The real ledger, answering a lookup only once ``event`` is set: the early NAS read
    then reaches the page before the tier the ledger names does."""

    def __init__(self, pool: asyncpg.Pool, event: threading.Event) -> None:
        super().__init__(pool)
        self.event = event

    async def prefix(self, namespace: bytes, keys: Sequence[bytes]) -> list[int]:
        assert await asyncio.to_thread(self.event.wait, 60), "the early NAS read never got there"
        return await super().prefix(namespace, keys)


async def _object_pages_with_a_stale_nas_copy(
    parts: tuple[NasTier, ObjectTier, Ledger],
) -> tuple[Namespace, list[Block], list[list[memoryview]]]:
    """Three pages held by the object store alone, so says the ledger; page 1 is also a NAS
    file the ledger does not count (re-evicted: written, its NAS row still to come). Also
    the memory for a landing of the three."""
    nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 3)
    await obj.put_many(blocks)
    await ledger.record(_entries(blocks), OBJECT)
    await nas.put_many([blocks[1]])
    return ns, blocks, [[memoryview(bytearray(b.nbytes))] for b in blocks]


async def test_an_overrun_early_read_holding_a_page_never_drops_the_object_row(parts) -> None:
    nas, obj, ledger = parts
    ns, blocks, views = await _object_pages_with_a_stale_nas_copy(parts)
    keys = [b.key for b in blocks]
    # the NAS thread that claims page 1 stays in the claim until the fetch is over
    landing = WatchedLanding(ns.digest, "float16", blocks[0].shape, views, page=1, hold=True)
    cost = CostModel(CostConfig(deadline_s={"host": 1.0, "nas": 1.0, "object": 60.0}))
    store = TieredStore(
        HostTier(1 << 30),
        nas=nas,
        obj=obj,
        ledger=LedgerAfter(ledger.pool, landing.claimed),
        cost=cost,
        config=StoreConfig(ledger_timeout_s=60.0),
    )
    try:
        got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=landing)
    finally:
        landing.go.set()
    landing.close(60.0)
    assert store.failures.count("nas", "deadline") == 1  # the early read overran ...
    assert got.tiers == ["object"]  # ... holding page 1, so the object store was refused it
    assert store.counters["repaired_object"] == 0  # refused is not missing
    assert await ledger.prefix(ns.digest, keys) == [OBJECT] * 3
    assert [b is not None for b in await obj.get_many(keys)] == [True] * 3
    await store.close()


async def test_a_corrupt_nas_copy_gives_its_page_back_to_the_object_store(parts) -> None:
    nas, obj, ledger = parts
    ns, blocks, views = await _object_pages_with_a_stale_nas_copy(parts)
    keys = [b.key for b in blocks]
    flip_byte(nas.path(keys[1]))
    landing = WatchedLanding(ns.digest, "float16", blocks[0].shape, views, page=1)
    store = TieredStore(
        HostTier(1 << 30),
        nas=nas,
        obj=obj,
        ledger=LedgerAfter(ledger.pool, landing.released),  # NAS read page 1 and failed it
        config=StoreConfig(ledger_timeout_s=60.0),
    )
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=landing)
    landing.close()
    assert store.stats()["tiers"]["nas"].corruptions == 1 and not nas.path(keys[1]).exists()
    assert store.counters["repaired_object"] == 0  # the object's copy is good: kept
    assert await ledger.prefix(ns.digest, keys) == [OBJECT] * 3
    assert got.tiers == ["object"] * 3  # NAS gave page 1 back, and the good copy landed
    assert [bytes(v[0]) for v in views] == [bytes(b.payload) for b in blocks]
    await store.close()


async def test_only_a_page_the_tier_lacks_is_repaired_never_one_it_was_refused(parts) -> None:
    _nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 2)
    keys = [b.key for b in blocks]
    await obj.put_many(blocks[:1])  # page 1: the ledger says OBJECT, the bucket has nothing
    await ledger.record(_entries(blocks), OBJECT)
    landing = Landing(
        ns.digest, "float16", blocks[0].shape, [[memoryview(bytearray(b.nbytes))] for b in blocks]
    )
    assert landing.fill(0, blocks[0]) is Landed.LANDED  # another writer took page 0 first
    store = _store(parts)
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes, into=landing)
    landing.close()
    assert got.tiers == []
    assert store.counters["repaired_object"] == 1
    assert await ledger.prefix(ns.digest, keys) == [OBJECT]  # page 0 kept, page 1 dropped
    await store.close()


class NasTelling(NasTier):
    """The real NAS tier, setting ``read`` once a read of it has answered."""

    def __init__(self, config: NasConfig) -> None:
        super().__init__(config)
        self.read = threading.Event()

    async def get_many(self, keys: Sequence[bytes]) -> list[Block | None]:
        try:
            return await super().get_many(keys)
        finally:
            self.read.set()


class LedgerWrittenBehind(Ledger):
    """The real ledger, before whose lookup answers a write-behind lands ``late``: written
    to the NAS and recorded, after the early NAS read looked for it."""

    def __init__(self, pool: asyncpg.Pool, nas: NasTelling, late: Block) -> None:
        super().__init__(pool)
        self.nas, self.late = nas, late

    async def prefix(self, namespace: bytes, keys: Sequence[bytes]) -> list[int]:
        assert await asyncio.to_thread(self.nas.read.wait, 60), "the early NAS read never ran"
        await self.nas.put_many([self.late])
        await self.record(_entries([self.late]), NAS)
        return await super().prefix(namespace, keys)


async def test_a_page_written_behind_the_early_read_is_not_dropped(parts, nas_dir: Path) -> None:
    """The early read found no file for page 2; before the ledger answered, the write-behind
    wrote and recorded it. The page is a miss this time, but its row and file stay."""
    _nas, obj, ledger = parts
    ns = namespace()
    blocks = chain(ns, 3)
    keys = [b.key for b in blocks]
    nas = NasTelling(NasConfig(nas_dir, fsync=False))
    await nas.put_many(blocks[:2])
    await ledger.record(_entries(blocks[:2]), NAS)
    store = TieredStore(
        HostTier(1 << 30),
        nas=nas,
        obj=obj,
        ledger=LedgerWrittenBehind(ledger.pool, nas, blocks[2]),
        config=StoreConfig(ledger_timeout_s=60.0),
    )
    got = await store.fetch(ns.digest, keys, PAGE, page_bytes=blocks[0].nbytes)
    assert got.tiers == ["nas"] * 2
    assert store.counters["repaired_nas"] == 0
    assert await ledger.prefix(ns.digest, keys) == [NAS] * 3 and nas.path(keys[2]).exists()
    await store.close()
    nas.close()
