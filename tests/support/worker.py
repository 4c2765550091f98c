"""Shared helpers for the worker HTTP tests: a real engine behind the real app, served in-process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from kvgate.stack.postgres import create_pool
from kvgate.wiring.engine import chat_template_of, kv_compute, kv_layout
from tiering.cost import CostConfig, CostModel
from tiering.ledger import Ledger
from tiering.store import TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectConfig, ObjectTier
from workers.context import ServerConfig
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.tokenizer import load_tokenizer
from workers.engine.weights import TINY_RANDOM, tiny_random
from workers.server import create_app

#: The context the tiny test engines are given (small, so "too long" prompts are cheap).
TINY_CONTEXT = 512
#: The tiny engine's model id, as requests name it.
MODEL = TINY_RANDOM
#: Greedy decoding that runs to ``max_tokens``: outputs comparable token for token.
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def tiny_engine(**options: object) -> TorchEngine:
    """The seeded tiny random Llama (SmolLM2's vocabulary) on CPU, as ``tiny-random``."""
    config, state = tiny_random()
    opts = EngineOptions(device="cpu", context_length=TINY_CONTEXT, **options)  # type: ignore[arg-type]
    return TorchEngine(config, state, opts, model_id=TINY_RANDOM)


def tiny_pool_bytes(pages: int, page_size: int = 16) -> int:
    """Bytes of a default CPU engine's pool holding ``pages`` pages of tiny-random KV."""
    config, _ = tiny_random()
    return pages * page_size * EngineOptions(device="cpu").kv_bytes_per_token(config)


def worker_app(engine: TorchEngine, gguf: Path, config: ServerConfig | None = None) -> Starlette:
    """The worker app around ``engine`` with the tokenizer and template of ``gguf``."""
    tokenizer = load_tokenizer(gguf)
    return create_app(engine, tokenizer, chat_template_of(tokenizer), config)


async def complete(client: httpx.AsyncClient, **fields: object) -> httpx.Response:
    """``POST /v1/completions`` for :data:`MODEL` with ``fields``."""
    return await client.post("/v1/completions", json={"model": MODEL, **fields})


async def greedy_turn(client: httpx.AsyncClient, prompt: list[int], salt: str) -> dict[str, Any]:
    """A 4-token greedy completion of ``prompt`` in cache namespace ``salt``; its JSON."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "cache_salt": salt, **GREEDY}
    reply = await client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached_by_tier(answer: dict[str, Any]) -> dict[str, int]:
    """Which tier served how many of an answer's cached prompt tokens."""
    return answer["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]


async def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition still false after {timeout} s")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started or task.done())
    if task.done():
        task.result()  # raises what stopped the server
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def tiered_tiny_engine(
    nas_dir: Path, *, dsn: str | None = None, s3: ObjectConfig | None = None, pages: int = 256
) -> Iterator[TorchEngine]:
    """:func:`tiny_engine` (``pages`` pages of 16 tokens) over host RAM, the NAS at
    ``nas_dir`` and, when given, the ledger on ``dsn`` and the object store ``s3``.

    Its cost model assumes a slow prefill (50 tokens/s) and learns no faster one, so every
    tier is worth fetching from: tests about restoring see restores, on any machine.
    """
    from workers.engine.tiered_offload import TieredOffload

    async def build() -> TieredStore:
        res = contextlib.AsyncExitStack()
        nas = NasTier(NasConfig(nas_dir, fsync=False))
        res.callback(nas.close)
        obj = ledger = None
        if s3 is not None:
            obj = await ObjectTier(s3).start()
            res.push_async_callback(obj.close)
        if dsn is not None:
            pool = await create_pool(dsn, min_size=0, max_size=4)
            res.push_async_callback(pool.close)
            ledger = Ledger(pool)
        cost = CostModel(CostConfig(prior_prefill_tokens_per_s=50.0))
        return TieredStore(
            HostTier(1 << 28), nas=nas, obj=obj, ledger=ledger, cost=cost, resources=res
        )

    config, state = tiny_random()
    options = EngineOptions(
        device="cpu", context_length=TINY_CONTEXT, kv_pool_bytes=tiny_pool_bytes(pages)
    )
    offload = TieredOffload(
        build,
        model_fingerprint=f"{TINY_RANDOM}@cpu",
        layout=kv_layout(config, options),
        compute=kv_compute(options),
        fetch_timeout_s=30,
    )
    try:
        engine = TorchEngine(config, state, options, model_id=TINY_RANDOM, offload=offload)
        try:
            yield engine
        finally:
            engine.close()
    finally:
        offload.close()
