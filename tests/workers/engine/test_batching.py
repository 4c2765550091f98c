"""Continuous batching under memory pressure, and abort."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from kvgate.wiring.engine import cores_to_the_engine, worker_options
from tests.support.engine import greedy, run, tiny_engine, tiny_llama, tokens
from workers.engine.api import GenerateRequest
from workers.engine.engine import TorchEngine

MODEL = tiny_llama(seed=5)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def _until(predicate, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _idle_and_clean(engine: TorchEngine) -> bool:
    """Nothing running and every used page is a cached one (no page leaked)."""
    load = engine.load()
    return load.running == 0 and load.queued == 0 and load.pool_used_pages == load.cached_pages


async def test_16_concurrent_overlapping_requests_with_a_small_pool() -> None:
    shared = _ids(40, 0)
    prompts = [shared[: 16 + (i % 3) * 8] + _ids(5 + i, 100 + i) for i in range(16)]
    solo = tiny_engine(MODEL)
    try:
        expected = [tokens(await run(solo, f"s{i}", p, greedy(30))) for i, p in enumerate(prompts)]
    finally:
        solo.close()
    # each request needs up to 5 pages; 12 pages hold about two of them at a time
    engine = tiny_engine(MODEL, pages=12, max_batch=16, token_budget=64)
    try:
        results = await asyncio.gather(
            *(run(engine, f"r{i}", p, greedy(30)) for i, p in enumerate(prompts))
        )
        assert [tokens(r) for r in results] == expected
        assert all(r[-1].finish_reason == "length" for r in results)
        assert engine.stats().preemptions > 0  # the pool really ran out mid-flight
        assert engine.stats().evicted_pages > 0
        await _until(lambda: _idle_and_clean(engine), "the engine to go idle")
    finally:
        engine.close()


async def test_a_request_waiting_for_room_does_not_empty_the_cache_meanwhile() -> None:
    """C cannot be admitted while A runs, even with every cached page evicted: it waits,
    and W's cached pages stay (they used to be evicted again at every step)."""
    engine = tiny_engine(MODEL, pages=12)
    try:
        await run(engine, "w", _ids(64, 11), greedy(1))  # leaves 4 cached pages
        assert engine.load().cached_pages == 4
        running = engine.generate(GenerateRequest("a", tuple(_ids(48, 12)), greedy(60)))
        await anext(running)  # A holds 4 pages, and grows
        waiting = asyncio.ensure_future(run(engine, "c", _ids(130, 13), greedy(1)))  # 9 pages
        await _until(lambda: engine.load().queued == 1, "C to queue behind A")
        for _ in range(3):  # steps taken while C waited
            await anext(running)
        # W's 4 pages stayed, beside A's 3 prompt pages, cached (and pinned) once prefilled
        assert engine.load().queued == 1 and engine.load().cached_pages == 4 + 3
        async for _ in running:
            pass
        assert (await waiting)[-1].finish_reason == "length"  # admitted once A was done
    finally:
        engine.close()


async def test_closing_the_stream_early_frees_every_page() -> None:
    engine = tiny_engine(MODEL)
    try:
        before = engine.load().pool_used_pages
        request = GenerateRequest("early", tuple(_ids(60, 1)), greedy(500))
        stream = engine.generate(request)
        async for event in stream:
            assert event.token_ids
            break
        await stream.aclose()  # type: ignore[attr-defined]
        await _until(lambda: _idle_and_clean(engine), "pages to be freed")
        # what stays is the prompt's 3 full pages, cached once prefilled, and evictable
        assert engine.load().pool_used_pages == before + 3
        assert engine.flush_cache() and engine.load().pool_used_pages == before
    finally:
        engine.close()


async def test_abort_running_and_queued_requests_frees_every_page() -> None:
    engine = tiny_engine(MODEL, max_batch=1)
    try:
        await run(engine, "warm", _ids(40, 2), greedy(2))  # leaves cached pages behind
        before = engine.load().pool_used_pages
        first = engine.generate(GenerateRequest("run", tuple(_ids(40, 2)), greedy(500)))
        second = engine.generate(GenerateRequest("wait", tuple(_ids(30, 3)), greedy(500)))
        got_first = asyncio.ensure_future(first.__anext__())
        got_second = asyncio.ensure_future(second.__anext__())
        await got_first
        await _until(lambda: engine.load().queued == 1, "the second request to queue")
        assert engine.abort("wait") and engine.abort("run")
        assert not engine.abort("nobody")
        last = await got_second
        assert last.finished and last.finish_reason == "abort"
        events = [e async for e in first]
        assert events[-1].finish_reason == "abort"
        await _until(lambda: engine.load().pool_used_pages == before, "pages to be freed")
    finally:
        engine.close()


async def test_a_sequence_longer_than_the_pool_ends_with_length() -> None:
    engine = tiny_engine(MODEL, pages=4)  # 64 tokens in all
    try:
        events = await run(engine, "long", _ids(40, 4), greedy(100))
        assert events[-1].finish_reason == "length"
        assert 0 < events[-1].completion_tokens < 100
        await _until(lambda: _idle_and_clean(engine), "the engine to go idle")
    finally:
        engine.close()


async def test_invalid_requests_are_refused_with_a_reason() -> None:
    engine = tiny_engine(MODEL, pages=8)
    try:
        with pytest.raises(ValueError, match="empty"):
            engine.generate(GenerateRequest("e", (), greedy(4)))
        with pytest.raises(ValueError, match="context"):
            engine.generate(GenerateRequest("c", (5,) * 1024, greedy(4)))
        with pytest.raises(ValueError, match="kv_pool_bytes"):
            engine.generate(GenerateRequest("p", (5,) * 200, greedy(4)))
        with pytest.raises(ValueError, match="token ids"):
            engine.generate(GenerateRequest("v", (5, 512), greedy(4)))
        stream = engine.generate(GenerateRequest("dup", (5, 6), greedy(100)))
        await stream.__anext__()
        with pytest.raises(ValueError, match="in use"):
            await engine.generate(GenerateRequest("dup", (5, 6), greedy(4))).__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        engine.close()


async def test_close_ends_open_streams_with_abort() -> None:
    engine = tiny_engine(MODEL)
    stream = engine.generate(GenerateRequest("open", tuple(_ids(20, 9)), greedy(10_000)))
    await stream.__anext__()
    engine.close()
    events = [e async for e in stream]
    assert events[-1].finished and events[-1].finish_reason == "abort"


async def test_chunked_prefill_beside_decoding_requests() -> None:
    long_prompt, short_prompt = _ids(150, 20), _ids(12, 21)
    solo = tiny_engine(MODEL)
    try:
        expected_long = tokens(await run(solo, "l", long_prompt, greedy(12)))
        expected_short = tokens(await run(solo, "s", short_prompt, greedy(40)))
    finally:
        solo.close()
    # 16 tokens per step: the long prompt takes ~10 steps of prefill while the short decodes
    engine = tiny_engine(MODEL, token_budget=16)
    try:
        short = asyncio.ensure_future(run(engine, "s", short_prompt, greedy(40)))
        await _until(lambda: engine.load().running == 1, "the short request to start")
        long = await run(engine, "l", long_prompt, greedy(12))
        assert tokens(long) == expected_long
        assert tokens(await short) == expected_short
        assert engine.stats().prefill_tokens >= 150
    finally:
        engine.close()


async def test_threads_option_sets_the_engine_threads_torch_threads(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Forward steps run with ``threads`` torch threads; the constructing thread keeps its own
    (OpenMP's count is per thread, and a second team beside the engine's slowed it down)."""
    before = torch.get_num_threads()
    engine = tiny_engine(MODEL, threads=before + 1)
    seen: list[int] = []
    forward = engine.model.forward

    def spy(batch, pool):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return forward(batch, pool)

    monkeypatch.setattr(engine.model, "forward", spy)
    try:
        await run(engine, "t", [5, 6, 7], greedy(2))
        assert seen and set(seen) == {before + 1}
        assert torch.get_num_threads() == before
    finally:
        engine.close()


def test_a_serving_process_leaves_its_cores_to_the_engine() -> None:
    """``cores_to_the_engine`` drops the calling thread to one torch thread and hands the
    count it had to the engine (run on a thread of its own to keep pytest's as it is)."""
    seen: dict[str, int] = {}

    def serve() -> None:
        torch.set_num_threads(3)
        options = cores_to_the_engine(worker_options(device="cpu"))
        seen.update(engine=options.engine.threads, caller=torch.get_num_threads())

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()
    assert seen == {"engine": 3, "caller": 1}
