"""Prefix reuse through the radix cache, at engine level, and namespace isolation."""

from __future__ import annotations

import torch

from tests.support.engine import greedy, run, tiny_engine, tiny_llama, tokens

MODEL = tiny_llama(seed=4)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_second_run_is_served_from_cache_with_identical_output() -> None:
    engine = tiny_engine(MODEL)
    try:
        prompt = _ids(70, 1)
        cold = await run(engine, "cold", prompt, greedy(24))
        assert cold[-1].cached_tokens == 0
        warm = await run(engine, "warm", prompt, greedy(24))
        # 69 tokens can come from cache (the last is recomputed for its logits): 4 full pages
        assert warm[-1].cached_tokens == 64
        assert warm[-1].cached_by_tier == {"device": 64}
        assert tokens(warm) == tokens(cold)
        assert engine.stats().cached_tokens == 64
    finally:
        engine.close()


async def test_multi_turn_history_reuses_the_previous_turn() -> None:
    engine = tiny_engine(MODEL)
    fresh = tiny_engine(MODEL)
    try:
        turn1 = _ids(40, 2)
        reply = tokens(await run(engine, "t1", turn1, greedy(20)))
        turn2 = turn1 + reply + _ids(30, 3)
        second = await run(engine, "t2", turn2, greedy(20))
        # turn 1's prompt and the reply's computed tokens (all but the last) were cached
        assert second[-1].cached_tokens == (40 + 20 - 1) // 16 * 16
        cold = await run(fresh, "cold", turn2, greedy(20))
        assert tokens(second) == tokens(cold)
    finally:
        engine.close()
        fresh.close()


async def test_namespaces_never_share_pages() -> None:
    engine = tiny_engine(MODEL)
    try:
        prompt = _ids(50, 4)
        a = await run(engine, "a", prompt, greedy(8), salt="tenant-a")
        b = await run(engine, "b", prompt, greedy(8), salt="tenant-b")
        again = await run(engine, "a2", prompt, greedy(8), salt="tenant-a")
        assert b[-1].cached_tokens == 0
        assert again[-1].cached_tokens == 48
        assert tokens(a) == tokens(b) == tokens(again)
    finally:
        engine.close()


async def test_flush_cache_drops_cached_pages() -> None:
    engine = tiny_engine(MODEL)
    try:
        prompt = _ids(40, 5)
        await run(engine, "x", prompt, greedy(4))
        assert engine.load().cached_pages > 0
        assert engine.flush_cache()
        load = engine.load()
        assert load.cached_pages == 0 and load.pool_used_pages == 0
        again = await run(engine, "y", prompt, greedy(4))
        assert again[-1].cached_tokens == 0
    finally:
        engine.close()
