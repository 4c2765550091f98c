"""The engine over the real tier ladder: a conversation restored from each tier alone gives
the same greedy output as a cold recompute; namespaces never share pages; a corrupted page
is a counted miss; broken backends only cost cache hits.

The tiny random Llama runs everywhere; the same scenario on SmolLM2 is marked ``slow``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgate.stack.ports import free_port
from kvgate.stack.postgres import create_pool
from kvgate.stack.seaweed import S3Endpoint
from kvgate.wiring.engine import kv_compute, kv_layout
from tests.support.engine import TinyModel, greedy, run, tiny_llama, tokens
from tests.support.tiering import fresh_database, object_config, read_only
from tiering.codec import decode
from tiering.cost import CostConfig, CostModel
from tiering.ledger import Ledger
from tiering.store import TieredStore
from tiering.tierd import Tierd, TierdConfig
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectConfig, ObjectTier
from workers.engine.config import ModelConfig
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.tiered_offload import TieredOffload

PAGE = 16


#: the engines' options but the pool size (their KV dtype is the CPU default's)
OPTIONS = EngineOptions(device="cpu", dtype="float32", page_size=PAGE)
#: the NAS's read threads, whatever the machine's CPUs: a 4-page restore reads every page
#: at once, one per thread
NAS_READ_THREADS = 4


def _engine(
    config: ModelConfig, state: Any, pages: int, offload=None, options: EngineOptions = OPTIONS
) -> TorchEngine:  # type: ignore[no-untyped-def]  # fmt: skip
    pool_bytes = pages * PAGE * options.kv_bytes_per_token(config)
    return TorchEngine(config, state, replace(options, kv_pool_bytes=pool_bytes), offload=offload)


def _offload(
    dsn: str | None, db: str | None, nas_dir: Path, obj_cfg: ObjectConfig | None, config,
    fetch_timeout_s: float = 30, options: EngineOptions = OPTIONS,
) -> TieredOffload:  # type: ignore[no-untyped-def]  # fmt: skip
    async def build() -> TieredStore:
        res = contextlib.AsyncExitStack()
        nas = NasTier(NasConfig(nas_dir, fsync=False, threads=NAS_READ_THREADS))
        res.callback(nas.close)
        obj = None
        if obj_cfg:
            obj = await ObjectTier(obj_cfg).start()
            res.push_async_callback(obj.close)
        ledger = None
        if dsn:
            pool = await create_pool(dsn, database=db, min_size=0, max_size=4)
            res.push_async_callback(pool.close)
            ledger = Ledger(pool)
        # a slow assumed prefill: these tests are about restoring, so every tier is worth it
        cost = CostModel(CostConfig(prior_prefill_tokens_per_s=50.0))
        return TieredStore(
            HostTier(1 << 30), nas=nas, obj=obj, ledger=ledger, cost=cost, resources=res
        )

    return TieredOffload(
        build,
        model_fingerprint="test-model",
        layout=kv_layout(config, options),
        compute=kv_compute(options),
        fetch_timeout_s=fetch_timeout_s,
    )


def _on_store(offload: TieredOffload, fn: Callable[[TieredStore], Any]) -> Any:
    async def call() -> Any:
        return fn(offload.store)

    return offload._call(call(), timeout=10)


@pytest.fixture
async def fresh_db(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn) as name:
        yield name


async def restore_from_each_tier(
    model: tuple[ModelConfig, Any], prompt: list[int], other: list[int], n_new: int,
    pg_dsn: str, db: str, nas_dir: Path, s3: S3Endpoint,
) -> None:  # fmt: skip
    """On ``model``: restore from host RAM, the NAS and the object store; corruption; another
    tenant."""
    config, state = model
    obj_cfg = object_config(s3)
    cold = _engine(config, state, pages=256)
    expected = tokens(await run(cold, "cold", prompt, greedy(n_new)))
    cold.close()
    offload = _offload(pg_dsn, db, nas_dir, obj_cfg, config)
    # exactly the pages the other conversation needs: running it evicts all of the prompt's
    assert len(prompt) + n_new <= len(other) + 4
    pages_needed = -(-(len(other) + 4) // PAGE)
    engine = _engine(config, state, pages=pages_needed, offload=offload)
    full = len(prompt) // PAGE * PAGE

    async def evict_prompt() -> None:
        await run(engine, f"other-{id(object())}", other, greedy(4))  # fills the pool
        offload.drain()

    async def again(tier: str, salt: str = "") -> None:
        events = await run(engine, f"{tier}-{salt}", prompt, greedy(n_new), salt)
        assert tokens(events) == expected, f"output differs after restoring from {tier}"
        if tier != "none":
            assert events[-1].cached_by_tier.get(tier) == full, events[-1].cached_by_tier
        else:
            assert events[-1].cached_tokens == 0

    try:
        assert tokens(await run(engine, "first", prompt, greedy(n_new))) == expected
        await evict_prompt()
        await again("host")

        await evict_prompt()
        _on_store(offload, lambda s: s.host.clear())
        await again("nas")

        await evict_prompt()
        _on_store(offload, lambda s: s.host.clear())
        pool = await create_pool(pg_dsn, database=db, min_size=1, max_size=2)
        nas = NasTier(NasConfig(nas_dir))
        async with ObjectTier(obj_cfg) as obj:
            report = await Tierd(
                pool, nas, obj, TierdConfig(nas_high_bytes=1, nas_low_bytes=0)
            ).run_pass()
        assert report.demoted > 0 and report.nas_bytes == 0
        await again("object")

        # a flipped byte in the first page's S3 object: a counted miss, deleted, same output
        await evict_prompt()
        _on_store(offload, lambda s: s.host.clear())
        first = offload.namespace("").page_keys(prompt)[0]
        async with ObjectTier(obj_cfg) as obj:
            await Tierd(pool, nas, obj, TierdConfig(nas_high_bytes=1, nas_low_bytes=0)).run_pass()
            name = obj.object_name(first)
            resp = await obj._client.get_object(Bucket=obj_cfg.bucket, Key=name)
            raw = bytearray(await resp["Body"].read())
            raw[-1] ^= 0x01
            await obj._client.put_object(Bucket=obj_cfg.bucket, Key=name, Body=bytes(raw))
            await again("none")
            assert offload.stats()["tiers"]["object"].corruptions == 1
            assert await obj.longest_prefix([first]) == 0

        # another tenant sends the same prompt: nothing of the first tenant's is used
        await evict_prompt()
        _on_store(offload, lambda s: s.host.clear())
        await again("none", salt="other-tenant")
        # a flipped byte in the first NAS page: a counted miss, deleted, the output unchanged
        await evict_prompt()
        _on_store(offload, lambda s: s.host.clear())
        ns_b = offload.namespace("other-tenant")
        ledger = Ledger(pool)
        assert (
            await ledger.prefix(ns_b.digest, ns_b.page_keys(prompt)) != []
        )  # its own pages, spilled
        ns_a = offload.namespace("")
        assert set(ns_a.page_keys(prompt)).isdisjoint(ns_b.page_keys(prompt))

        key = ns_b.page_keys(prompt)[0]
        path = nas.path(key)
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        path.write_bytes(raw)
        await again("none", salt="other-tenant")
        stats = offload.stats()
        assert stats["tiers"]["nas"].corruptions == 1
        offload.drain()  # the recomputed page went down again (write-through), intact
        assert decode(path.read_bytes()).key == key
        await pool.close()
        nas.close()
    finally:
        engine.close()
        offload.close()


TINY: TinyModel = tiny_llama(seed=3)


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_tiny_model_restores_from_every_tier(pg_dsn, fresh_db, nas_dir, s3_server) -> None:  # type: ignore[no-untyped-def]
    await restore_from_each_tier(
        (TINY.config, TINY.state_dict), _ids(70, 1, 512), _ids(100, 2, 512), 8,
        pg_dsn, fresh_db, nas_dir, s3_server,
    )  # fmt: skip


@pytest.mark.slow
async def test_smollm2_restores_from_every_tier(
    smollm2_gguf, pg_dsn, fresh_db, nas_dir, s3_server
) -> None:  # type: ignore[no-untyped-def]
    from workers.engine.weights import load_model_weights

    config, state = load_model_weights(smollm2_gguf)
    vocab = config.vocab_size
    await restore_from_each_tier(
        (config, state), _ids(100, 4, vocab), _ids(120, 5, vocab), 12,
        pg_dsn, fresh_db, nas_dir, s3_server,
    )  # fmt: skip


async def test_another_worker_resumes_from_the_nas_while_the_first_still_holds_it(
    pg_dsn: str, fresh_db: str, nas_dir: Path
) -> None:
    """Write-through: once a request ends its pages are on the shared NAS (and in the
    ledger), so a second worker serves the follow-up from there although the first worker
    evicted nothing; the output is a cold recompute's."""
    prompt = _ids(70, 12, 512)
    offloads = [_offload(pg_dsn, fresh_db, nas_dir, None, TINY.config) for _ in range(2)]
    first, second = (_engine(TINY.config, TINY.state_dict, pages=64, offload=o) for o in offloads)
    cold = _engine(TINY.config, TINY.state_dict, pages=256)
    try:
        expected = tokens(await run(cold, "cold", prompt, greedy(8)))
        assert tokens(await run(first, "a", prompt, greedy(8))) == expected
        assert first.cache.evicted_pages == 0
        offloads[0].drain()
        resumed = await run(second, "b", prompt, greedy(8))
        assert resumed[-1].cached_by_tier == {"nas": 64}
        assert tokens(resumed) == expected
        # served from the first worker's L1 again: the ledger sees the pages in use, so
        # tierd's least-recently-used choices do not take them for idle
        first_key = offloads[0].namespace("").page_keys(prompt)[0]
        pool = await create_pool(pg_dsn, database=fresh_db, min_size=1, max_size=1)
        sql = "SELECT last_access FROM kv_ledger WHERE key = $1"
        before = await pool.fetchval(sql, first_key)
        again = await run(first, "c", prompt, greedy(8))
        assert again[-1].cached_by_tier == {"device": 64}
        offloads[0]._call(offloads[0].store.ledger.flush_touches(), 10)  # or the 1 s loop did
        assert await pool.fetchval(sql, first_key) > before
        # A longer turn served by the second worker puts its new pages on the NAS. The
        # first worker then has the head in L1 and fetches the rest: the fetch notes the
        # head's use as well (the scheduler does not touch it a second time).
        longer = prompt + _ids(40, 13, 512)
        assert tokens(await run(second, "d", longer, greedy(8))) == tokens(
            await run(cold, "cold-longer", longer, greedy(8))
        )
        offloads[1].drain()
        before = await pool.fetchval(sql, first_key)
        later = await run(first, "e", longer, greedy(8))
        assert later[-1].cached_by_tier == {"device": 64, "nas": 32}
        offloads[0]._call(offloads[0].store.ledger.flush_touches(), 10)
        assert await pool.fetchval(sql, first_key) > before
        await pool.close()
    finally:
        for engine in (first, second, cold):
            engine.close()
        for offload in offloads:
            offload.close()


async def test_broken_backends_only_cost_cache_hits(nas_dir: Path, s3_server: S3Endpoint) -> None:
    """Postgres unreachable, S3 on a dead port, then a read-only NAS: answers stay right."""
    dead_s3 = ObjectConfig(
        endpoint_url=f"http://127.0.0.1:{free_port()}", bucket="kvtest", access_key="x",
        secret_key="y", max_attempts=1, connect_timeout=0.2,
    )  # fmt: skip
    dead_pg = f"postgresql://kv@127.0.0.1:{free_port()}/kv"
    offload = _offload(dead_pg, None, nas_dir, dead_s3, TINY.config)
    prompt, other = _ids(70, 6, 512), _ids(100, 7, 512)
    engine = _engine(TINY.config, TINY.state_dict, pages=7, offload=offload)  # other fills it
    cold = _engine(TINY.config, TINY.state_dict, pages=256)
    try:
        expected = tokens(await run(cold, "cold", prompt, greedy(6)))
        assert tokens(await run(engine, "a", prompt, greedy(6))) == expected
        await run(engine, "b", other, greedy(4))
        offload.drain()
        _on_store(offload, lambda s: s.host.clear())
        again = await run(engine, "c", prompt, greedy(6))
        assert tokens(again) == expected
        assert again[-1].cached_by_tier.get("nas") == 64  # the NAS alone still serves
        failures = offload.stats()["failures"]
        assert failures.get("ledger.record", 0) >= 1 and failures.get("ledger.lookup", 0) >= 1
        with read_only(nas_dir):  # and now the NAS refuses writes too
            await run(engine, "d", _ids(100, 11, 512), greedy(4))  # new pages to write
            offload.drain()
            _on_store(offload, lambda s: s.host.clear())
            assert tokens(await run(engine, "e", prompt, greedy(6))) == expected
            assert offload.stats()["failures"].get("nas.write", 0) >= 1
    finally:
        engine.close()
        cold.close()
        offload.close()


async def test_an_abandoned_restore_never_writes_pages_in_use(nas_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """NAS reads that hang past the fetch timeout: the request recomputes on other pages,
    the pages the reads still write are held back, and come back when the reads end."""
    offload = _offload(None, None, nas_dir, None, TINY.config, fetch_timeout_s=0.5)
    prompt, others = _ids(70, 8, 512), [_ids(100, 9, 512), _ids(100, 10, 512)]
    # room for the prompt's pages twice over: held back once, taken fresh once
    engine = _engine(TINY.config, TINY.state_dict, pages=11, offload=offload)
    cold = _engine(TINY.config, TINY.state_dict, pages=256)
    go, ended = threading.Event(), threading.Semaphore(0)
    read_pages, land_run = NasTier._read_pages, NasTier._land_run

    def hanging_read(self, *args):  # type: ignore[no-untyped-def]
        assert go.wait(30), "the test never let the read go on"
        return read_pages(self, *args)

    def counted_run(self, *args, **kw):  # type: ignore[no-untyped-def]
        try:
            return land_run(self, *args, **kw)
        finally:
            ended.release()

    try:
        expected = tokens(await run(cold, "cold", prompt, greedy(6)))
        assert tokens(await run(engine, "a", prompt, greedy(6))) == expected
        for i, other in enumerate(others):  # evict the prompt's 4 pages to the NAS
            await run(engine, f"b{i}", other, greedy(4))
        offload.drain()
        _on_store(offload, lambda s: s.host.clear())
        monkeypatch.setattr(NasTier, "_read_pages", hanging_read)
        monkeypatch.setattr(NasTier, "_land_run", counted_run)

        again = await run(engine, "c", prompt, greedy(6))
        assert tokens(again) == expected and again[-1].cached_tokens == 0
        assert engine.pool.held_back == NAS_READ_THREADS  # one per page being read
        assert offload.stats()["failures"].get("offload.late", 0) == 1

        go.set()  # the reads finish now, into the held-back pages only
        for _ in range(NAS_READ_THREADS):  # one run of pages per reading thread
            assert ended.acquire(timeout=30)
        monkeypatch.setattr(NasTier, "_read_pages", read_pages)
        _on_store(offload, lambda s: s.host.clear())
        final = await run(engine, "d", prompt, greedy(6))
        assert tokens(final) == expected
        assert engine.pool.held_back == 0  # given back, and reused
    finally:
        go.set()
        engine.close()
        cold.close()
        offload.close()


async def test_a_pool_of_another_kv_dtype_never_loads_the_tiers_pages(nas_dir: Path) -> None:
    """Pages the tiers hold as float16 are a miss for a bfloat16 pool, never its bytes: the
    two have the same size, so only the layout check stands between them and wrong KV."""
    config, state = TINY.config, TINY.state_dict
    offload = _offload(None, None, nas_dir, None, config)
    bf16_options = replace(OPTIONS, kv_dtype="bfloat16")
    page_bytes = PAGE * bf16_options.kv_bytes_per_token(config)
    assert page_bytes == PAGE * OPTIONS.kv_bytes_per_token(config)
    half = _engine(config, state, pages=7, offload=offload)  # the other prompt fills it
    bf16 = TorchEngine(
        config, state, replace(bf16_options, kv_pool_bytes=7 * page_bytes), offload=offload
    )
    cold = TorchEngine(config, state, replace(bf16_options, kv_pool_bytes=256 * page_bytes))
    prompt, other = _ids(70, 8, 512), _ids(100, 9, 512)
    try:
        await run(half, "a", prompt, greedy(6))
        await run(half, "b", other, greedy(4))  # the prompt's pages are on the tiers
        offload.drain()
        assert (await run(half, "c", prompt, greedy(6)))[-1].cached_tokens == 64  # there ...
        again = await run(bf16, "d", prompt, greedy(6))  # ... but not for bfloat16
        assert again[-1].cached_tokens == 0
        assert tokens(again) == tokens(await run(cold, "cold", prompt, greedy(6)))
        assert offload.stats()["failures"].get("offload.load", 0) >= 1
        # and bfloat16 pages are refused on the way down rather than stored as float16
        await run(bf16, "e", other, greedy(4))
        assert offload.stats()["failures"].get("offload.offer", 0) >= 1
    finally:
        half.close()
        bf16.close()
        cold.close()
        offload.close()


async def test_engines_computing_in_another_dtype_never_restore_each_others_pages(
    nas_dir: Path,
) -> None:
    """Two CPU workers on one NAS, both keeping float16 KV, one computing in float32 and the
    other in bfloat16: same weights, same KV layout, other KV bytes. The bfloat16 worker must
    recompute the prompt rather than restore the float32 worker's pages."""
    config, state = TINY.config, TINY.state_dict
    bf16_options = replace(OPTIONS, dtype="bfloat16")
    assert kv_layout(config, bf16_options) == kv_layout(config, OPTIONS)  # the pool can't tell
    f32_tiers = _offload(None, None, nas_dir, None, config)
    bf16_tiers = _offload(None, None, nas_dir, None, config, options=bf16_options)
    f32 = _engine(config, state, pages=7, offload=f32_tiers)  # the other prompt fills it
    bf16 = _engine(config, state, pages=7, offload=bf16_tiers, options=bf16_options)
    cold_bf16 = _engine(config, state, pages=256, options=bf16_options)
    prompt, other = _ids(70, 11, 512), _ids(100, 12, 512)
    try:
        await run(f32, "a", prompt, greedy(6))
        await run(f32, "b", other, greedy(4))  # evicts the prompt's 4 pages to the NAS
        f32_tiers.drain()
        again = await run(bf16, "c", prompt, greedy(6))
        assert again[-1].cached_tokens == 0, again[-1].cached_by_tier
        assert tokens(again) == tokens(await run(cold_bf16, "cold", prompt, greedy(6)))
        # the pages are on the NAS all the same: the float32 worker restores them from there
        _on_store(f32_tiers, lambda s: s.host.clear())
        assert (await run(f32, "d", prompt, greedy(6)))[-1].cached_by_tier.get("nas") == 64
    finally:
        for engine in (f32, bf16, cold_bf16):
            engine.close()
        f32_tiers.close()
        bf16_tiers.close()


def test_the_device_type_scopes_the_keys(nas_dir: Path) -> None:
    """A CPU float16 worker and a CUDA one, both with float16 KV: one layout, two namespaces
    (other kernels write other bytes). Only the device type counts, not its index."""
    config = TINY.config
    cpu = replace(OPTIONS, dtype="float16", kv_dtype="float16")
    cuda, cuda1 = replace(cpu, device="cuda"), replace(cpu, device="cuda:1")
    assert kv_layout(config, cpu) == kv_layout(config, cuda)
    assert (kv_compute(cpu), kv_compute(cuda)) == ("float16@cpu", "float16@cuda")
    assert kv_compute(cuda1) == kv_compute(cuda)
    offloads = [_offload(None, None, nas_dir, None, config, options=o) for o in (cpu, cuda)]
    try:
        on_cpu, on_cuda = (o.namespace("team") for o in offloads)
        assert on_cpu.digest != on_cuda.digest
        assert set(on_cpu.page_keys(range(64))).isdisjoint(on_cuda.page_keys(range(64)))
    finally:
        for offload in offloads:
            offload.close()
