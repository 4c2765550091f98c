"""The radix cache's side of cold storage: which pages of a namespace may leave the device
(never one a running request pins, never another namespace's), and that freeing them later
keeps any a request pinned or extended in between."""

from __future__ import annotations

from workers.engine.kv_pool import KVPool
from workers.engine.radix import RadixCache
from workers.engine.weights import tiny_random

PAGE = 4


def _cache() -> RadixCache:
    config, _ = tiny_random()
    pool = KVPool(config, pool_bytes=config.kv_bytes_per_token(4) * PAGE * 32, page_size=PAGE)
    return RadixCache(pool)


def _insert(cache: RadixCache, namespace: str, tokens: list[int]) -> None:
    pages = cache.pool.alloc(len(tokens) // PAGE)
    _, held = cache.insert(namespace, tokens, pages)
    cache.pool.free([p for p, h in zip(pages, held, strict=True) if p != h])


def test_only_the_namespaces_unpinned_pages_are_listed_children_first() -> None:
    cache = _cache()
    mine = list(range(100, 112))  # 3 pages
    _insert(cache, "mine", mine)
    _insert(cache, "mine", [*mine[:8], 7, 7, 7, 7])  # a branch after page 2
    _insert(cache, "theirs", mine)  # same tokens, another namespace
    running = cache.match("mine", mine[:4])  # a request pins page 1
    cache.lock(running.node)

    nodes, chains, pinned = cache.unpinned("mine")
    assert pinned == 1
    assert sorted(chains) == sorted([tuple(mine[:8]), tuple(mine), tuple(mine[:8] + [7] * 4)])
    assert chains.index(tuple(mine[:8])) > max(
        chains.index(tuple(mine)), chains.index(tuple(mine[:8] + [7] * 4))
    ), "a parent is listed before its children"

    used = cache.pool.used_pages
    assert cache.drop(nodes) == 3
    assert cache.pool.used_pages == used - 3
    assert cache.match("mine", mine).pages == running.pages  # the pinned page stayed
    assert len(cache.match("theirs", mine).pages) == 3  # the other namespace is untouched
    cache.unlock(running.node)


def test_pages_pinned_or_extended_after_listing_are_kept() -> None:
    cache = _cache()
    tokens = list(range(200, 212))
    _insert(cache, "mine", tokens)
    nodes, _, pinned = cache.unpinned("mine")
    assert (len(nodes), pinned) == (3, 0)
    # meanwhile a new turn extends the conversation and another pins its first page
    _insert(cache, "mine", [*tokens, 9, 9, 9, 9])
    running = cache.match("mine", tokens[:4])
    cache.lock(running.node)

    # page 3 now has a child and pages 1-2 lead to it; nothing listed can go yet
    assert cache.drop(nodes) == 0
    assert len(cache.match("mine", tokens + [9] * 4).pages) == 4
    cache.unlock(running.node)


def test_a_page_evicted_and_cached_again_after_listing_is_not_freed_twice() -> None:
    cache = _cache()
    tokens = list(range(300, 304))
    _insert(cache, "mine", tokens)
    nodes, _, _ = cache.unpinned("mine")
    assert cache.evict(10) == 1
    _insert(cache, "mine", tokens)  # a fresh node for the same page
    free = cache.pool.free_pages
    assert cache.drop(nodes) == 0
    assert cache.pool.free_pages == free
    assert len(cache.match("mine", tokens).pages) == 1
