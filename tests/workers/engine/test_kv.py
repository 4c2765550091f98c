"""The KV pool, the radix cache over it, and the offload seam that tiering plugs into."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
import torch

from tests.support.engine import greedy, run, tiny_engine, tiny_llama, tokens
from workers.engine import held_back as held_back_module
from workers.engine.api import GenerateRequest
from workers.engine.kv_pool import KVPool, PoolExhausted, RestoreTarget
from workers.engine.offload import OffloadPage, Restored
from workers.engine.radix import RadixCache

MODEL = tiny_llama(seed=7)
PAGE_BYTES = MODEL.config.kv_bytes_per_token(4) * 4


def _pool(pages: int) -> KVPool:
    return KVPool(MODEL.config, pool_bytes=pages * PAGE_BYTES, page_size=4)


def test_pool_accounting_and_page_round_trip() -> None:
    pool = _pool(8)
    assert pool.layout.page_shape == (2, 4, 2, 2, 16)
    assert pool.layout.dtype == "float32" and pool.layout.layout == "layer,token,kv,head,dim"
    pages = pool.alloc(3)
    assert pool.used_pages == 3 and pool.free_pages == 5
    with pytest.raises(PoolExhausted):
        pool.alloc(6)
    assert pool.free_pages == 5  # a failed alloc takes nothing
    data = torch.randn(2, *pool.layout.page_shape)
    pool.write_pages(pages[1:], data)
    assert torch.equal(torch.stack(pool.page_copies(pages[1:])), data)
    assert torch.equal(pool.page_copies([pages[2]])[0], data[1])
    copies = pool.page_copies(pages[1:])
    pool.write_pages(pages[1:], torch.zeros_like(data))
    assert torch.equal(torch.stack(copies), data)  # copies, not views of the pool
    # each memory of its own (host RAM keeps them as they are and frees them one by one)
    assert all(c.untyped_storage().nbytes() == c.nbytes for c in copies)
    assert pool.page_copies([]) == []
    pool.write_pages(pages[1:], data)
    # a page's layout is its slots': token t of layer l is row p * page_stride + t of l's view
    assert pool.page_stride == pool.layout.num_layers * 4
    for layer in range(pool.layout.num_layers):
        for t in range(4):
            row = pool.layer_slots[layer][pages[2] * pool.page_stride + t]
            assert torch.equal(row, data[1, layer, t])
    with pytest.raises(ValueError, match="expected"):
        pool.write_pages(pages[:1], data[:1, :1])
    with pytest.raises(ValueError, match="2 pages of KV for 1 page ids"):
        pool.write_pages(pages[:1], data)
    pool.free(pages)
    assert pool.used_pages == 0
    with pytest.raises(ValueError, match="kv_pool_bytes"):
        _pool(1)


def test_a_restore_writes_bytes_straight_into_the_slots() -> None:
    pool = _pool(8)
    pages = pool.alloc(3)
    before = torch.stack(pool.page_copies(pages))
    target = pool.restore_target(pages[1:])
    assert target.in_pool and len(target.views) == 2
    assert all(len(parts) == 1 for parts in target.views)  # a page is one run of bytes
    new = torch.randn(2, *pool.layout.page_shape)
    for parts, page in zip(target.views, new, strict=True):
        raw = memoryview(page.contiguous().view(torch.uint8).numpy()).cast("B")
        pos = 0
        for part in parts:
            part[:] = raw[pos : pos + part.nbytes]
            pos += part.nbytes
    target.commit(2)  # nothing left to move on a CPU pool
    assert torch.equal(torch.stack(pool.page_copies(pages[1:])), new)
    assert torch.equal(
        torch.stack(pool.page_copies(pages[:1])), before[:1]
    )  # its neighbour is untouched


def test_held_back_pages_return_only_when_given_back() -> None:
    pool = _pool(4)
    pages = pool.alloc(4)
    give_back = pool.hold_back(pages[0])
    pool.free(pages[1:])
    assert pool.free_pages == 3 and pool.held_back == 1
    assert pages[0] not in pool.alloc(3)
    give_back()  # as the late reader's thread would
    # Reading how many are used (as load() does on the event loop's thread) counts the page
    # as free but leaves the free list alone: only the engine's thread moves pages.
    assert pool.used_pages == 3 and pool.held_back == 1
    assert pool.alloc(1) == [pages[0]] and pool.held_back == 0


async def test_admission_gives_up_on_held_back_pages_that_never_return(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A tier read that never returns keeps its pages held back: the request that needs
    them is refused after the give-up time instead of waiting for ever, the next one at
    once while the same pages are still out, and requests run again once they are back.
    Pages held back later are other pages: the first request they stop waits for them
    again, even when as many are out as when admission last gave up."""
    monkeypatch.setattr(held_back_module, "HELD_BACK_GIVE_UP_S", 0.3)
    engine = tiny_engine(MODEL, pages=8)  # 8 pages of 16 tokens
    try:
        held = engine.pool.alloc(4)  # the engine is idle: nothing else touches the pool
        give_back = [engine.pool.hold_back(page) for page in held]
        prompt = [(7 * i) % 200 + 3 for i in range(100)]  # 7 pages with its answer: 4 free
        start = time.monotonic()
        refused = await asyncio.wait_for(run(engine, "stuck", prompt, greedy(4)), 30)
        waited = time.monotonic() - start
        assert tokens(refused) == [] and refused[-1].finish_reason == "length"
        assert waited >= 0.3  # it did wait for the pages first
        # a wait now would never end: the next request must be refused without one
        monkeypatch.setattr(held_back_module, "HELD_BACK_GIVE_UP_S", 1e9)
        again = await asyncio.wait_for(run(engine, "stuck-too", prompt, greedy(4)), 30)
        assert tokens(again) == []
        for back in give_back:
            back()
        served = await asyncio.wait_for(run(engine, "later", prompt, greedy(4)), 30)
        assert len(tokens(served)) == 4 and served[-1].finish_reason == "length"
        assert engine.pool.held_back == 0
        monkeypatch.setattr(held_back_module, "HELD_BACK_GIVE_UP_S", 0.3)
        assert engine.flush_cache()  # the engine is idle again: its cache gives its pages up
        held = engine.pool.alloc(4)
        give_back = [engine.pool.hold_back(page) for page in held]  # 4 out, as before
        start = time.monotonic()
        refused = await asyncio.wait_for(run(engine, "stuck-anew", prompt, greedy(4)), 30)
        assert tokens(refused) == [] and time.monotonic() - start >= 0.3
        for back in give_back:
            back()
    finally:
        engine.close()


def test_radix_match_lock_and_lru_eviction_with_hook() -> None:
    pool = _pool(8)
    evicted: list[OffloadPage] = []
    cache = RadixCache(pool, evicted.extend)
    a = list(range(100, 112))  # 3 pages
    b = [*a[:4], *range(200, 208)]  # shares the first page with a
    pa = pool.alloc(3)
    pool.write_pages(
        pa, torch.arange(3.0)[:, None, None, None, None, None].expand(3, 2, 4, 2, 2, 16)
    )
    _, held = cache.insert("ns", a, pa)
    assert held == pa
    pb = pool.alloc(3)
    node_b, held = cache.insert("ns", b, pb)
    assert held == [pa[0], *pb[1:]]  # the shared page stays the tree's; pb[0] is the caller's
    pool.free([pb[0]])
    assert cache.cached_pages == 5
    assert cache.match("ns", [*a, 1, 2]).pages == pa
    assert cache.match("ns", a, max_pages=2).pages == pa[:2]
    assert cache.match("other", a).pages == []  # namespaces are separate trees
    cache.lock(node_b)
    assert cache.evictable_pages == 2  # a's own two pages; b's path is pinned
    cache.match("ns", a[:8])  # touch a's first two pages: a's leaf is now the oldest
    assert cache.evict(1) == 1
    assert [e.token_ids for e in evicted] == [tuple(a)]
    assert torch.equal(evicted[0].kv, pool.page_copies([pa[2]])[0])
    assert evicted[0].namespace == "ns"
    assert cache.evict(10) == 1  # a's second page; the rest is pinned
    assert evicted[1].token_ids == tuple(a[:8])
    cache.unlock(node_b)
    assert cache.flush() == 3 and len(evicted) == 2  # flush drops without offloading
    assert pool.used_pages == 0 and cache.cached_pages == 0


def test_radix_hands_each_page_down_once() -> None:
    """Write-through: pages go to the tiers when the tree takes them, once; evicting them,
    or pages the tiers gave back, sends nothing again. Write-back: evicting pages the tiers
    gave back sends nothing either."""
    pool = _pool(8)
    offered: list[OffloadPage] = []
    cache = RadixCache(pool, offered.extend, write_through=True)
    a = list(range(100, 112))  # 3 pages
    b = [*a[:4], *range(200, 208)]  # shares the first page with a
    pa = pool.alloc(3)
    pool.write_pages(
        pa, torch.arange(3.0)[:, None, None, None, None, None].expand(3, 2, 4, 2, 2, 16)
    )
    cache.insert("ns", a, pa)
    assert [p.token_ids for p in offered] == [tuple(a[:4]), tuple(a[:8]), tuple(a)]
    assert torch.equal(torch.stack([p.kv for p in offered]), torch.stack(pool.page_copies(pa)))
    pb = pool.alloc(3)
    cache.insert("ns", b, pb)
    pool.free([pb[0]])
    assert [p.token_ids for p in offered[3:]] == [tuple(b[:8]), tuple(b)]  # b's own pages
    restored = pool.alloc(1)
    cache.insert("ns", [*a, *range(300, 304)], [*pa, *restored], stored=True)
    assert len(offered) == 5  # pages from the tiers are not sent back
    assert cache.evict(10) == 6 and len(offered) == 5  # all were handed down already

    back: list[OffloadPage] = []
    write_back = RadixCache(pool, back.extend)
    pc = pool.alloc(2)
    write_back.insert("ns", a[:8], pc[:1], stored=True)
    write_back.insert("ns", a[:8], pc)
    assert back == []  # write-back sends nothing when the tree takes pages
    assert write_back.evict(10) == 2
    assert [p.token_ids for p in back] == [tuple(a[:8])]  # not the one from the tiers


class InMemoryOffload:
    """A dict standing in for the host tier: the real one is tiering's adapter."""

    def __init__(self, *, write_through: bool = False) -> None:
        self.write_through = write_through
        self.pages: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self.offered = 0
        self.touched: list[tuple[str, tuple[int, ...]]] = []

    def offer(self, pages: list[OffloadPage]) -> None:
        self.offered += len(pages)
        for page in pages:
            self.pages[(page.namespace, page.token_ids)] = page.kv.clone()

    def touch(self, namespace: str, token_ids: Sequence[int], n_pages: int) -> None:
        self.touched.append((namespace, tuple(token_ids[: n_pages * 16])))

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, target: RestoreTarget
    ) -> Restored:
        found = []
        for i in range(start_page, start_page + len(target.page_ids)):
            kv = self.pages.get((namespace, tuple(token_ids[: (i + 1) * 16])))
            if kv is None:
                break
            found.append(kv)
        if not found:
            return Restored()
        target.pool.write_pages(target.page_ids[: len(found)], torch.stack(found))
        return Restored(("host",) * len(found))


async def test_evicted_pages_come_back_through_the_offload() -> None:
    offload = InMemoryOffload()
    engine = tiny_engine(MODEL, pages=8, offload=offload)
    cold = tiny_engine(MODEL)
    try:
        prompt = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(1)).tolist()
        first = tokens(await run(engine, "a", prompt, greedy(10)))
        other = torch.randint(3, 512, (100,), generator=torch.Generator().manual_seed(2)).tolist()
        await run(engine, "b", other, greedy(10))  # needs the pool: evicts the first prompt
        assert any(ns == "" and chain == tuple(prompt[:64]) for ns, chain in offload.pages)
        again = await run(engine, "a2", prompt, greedy(10))
        assert again[-1].cached_tokens == 64
        assert again[-1].cached_by_tier.get("host", 0) > 0
        assert sum(again[-1].cached_by_tier.values()) == 64
        assert tokens(again) == first == tokens(await run(cold, "c", prompt, greedy(10)))
        assert engine.stats().cached_tokens_by_tier["host"] > 0
    finally:
        engine.close()
        cold.close()


class BrokenOffload:
    """A lower tier that fails every call, as a crashed NAS mount would."""

    write_through = True

    def __init__(self) -> None:
        self.calls = 0

    def offer(self, pages: list[OffloadPage]) -> None:
        self.calls += 1
        raise OSError("NAS unreachable")

    def touch(self, namespace: str, token_ids: Sequence[int], n_pages: int) -> None:
        self.calls += 1
        raise OSError("NAS unreachable")

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, target: RestoreTarget
    ) -> Restored:
        self.calls += 1
        raise OSError("NAS unreachable")


async def test_write_through_lets_another_engine_resume_what_this_one_still_holds() -> None:
    """Two workers on the same lower tiers: the second resumes a conversation from them
    while the first still has it in L1 (nothing was evicted), and its output is a cold
    recompute's."""
    tiers = InMemoryOffload(write_through=True)
    first_worker = tiny_engine(MODEL, pages=64, offload=tiers)
    second_worker = tiny_engine(MODEL, pages=64, offload=tiers)
    cold = tiny_engine(MODEL)
    try:
        prompt = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(5)).tolist()
        first = tokens(await run(first_worker, "a", prompt, greedy(10)))
        assert first_worker.cache.evicted_pages == 0
        assert (("", tuple(prompt[:64])) in tiers.pages) and tiers.offered == 4  # 80 tokens
        resumed = await run(second_worker, "b", prompt, greedy(10))
        assert resumed[-1].cached_by_tier == {"host": 64}
        assert tokens(resumed) == first == tokens(await run(cold, "c", prompt, greedy(10)))
        assert tiers.touched == []  # neither L1 held the conversation yet
        again = await run(first_worker, "a2", prompt, greedy(10))
        assert again[-1].cached_by_tier == {"device": 64}
        assert tiers.offered == 4  # nothing new to send
        assert tiers.touched == [("", tuple(prompt[:64]))]  # served from L1: still in use
    finally:
        first_worker.close()
        second_worker.close()
        cold.close()


async def test_a_prompt_goes_down_once_prefilled_and_is_shared_while_it_decodes() -> None:
    """Under write-through a request's full prompt pages reach the tiers right after its
    prefill, while it still decodes (not all at once when it ends), and a second request
    with the same prompt reuses them from L1 meanwhile; the output is a cold recompute's."""
    tiers = InMemoryOffload(write_through=True)
    engine = tiny_engine(MODEL, pages=64, offload=tiers)
    cold = tiny_engine(MODEL)
    try:
        prompt = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(8)).tolist()
        first = engine.generate(GenerateRequest("long", tuple(prompt), greedy(40)))
        got = [await anext(first)]
        assert tiers.offered == 4  # the 64 prompt tokens' 4 full pages, first token out
        assert ("", tuple(prompt[:64])) in tiers.pages
        second = await run(engine, "same", prompt, greedy(5))
        assert second[-1].cached_by_tier == {"device": 64}
        got += [event async for event in first]
        assert tiers.offered == 6  # at the end, the 110 tokens' other 2 full pages
        assert tokens(got) == tokens(await run(cold, "cold", prompt, greedy(40)))
        assert tokens(second) == tokens(await run(cold, "cold2", prompt, greedy(5)))
    finally:
        engine.close()
        cold.close()


async def test_a_failing_offload_costs_recompute_not_requests() -> None:
    offload = BrokenOffload()
    engine = tiny_engine(MODEL, pages=8, offload=offload)
    try:
        prompt = torch.randint(3, 512, (70,), generator=torch.Generator().manual_seed(3)).tolist()
        first = await run(engine, "a", prompt, greedy(10))
        other = torch.randint(3, 512, (100,), generator=torch.Generator().manual_seed(4)).tolist()
        await run(engine, "b", other, greedy(10))
        again = await run(engine, "c", prompt, greedy(10))
        assert offload.calls >= 2
        assert tokens(again) == tokens(first) and again[-1].finish_reason == "length"
        assert set(again[-1].cached_by_tier) <= {"device"}  # nothing came from below
    finally:
        engine.close()
