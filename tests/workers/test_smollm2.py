"""On the real model: a multi-turn chat reuses its cached history, and the reuse
does not change a single greedy token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from kvgate.models.registry import DEFAULT_MODEL
from kvgate.wiring.engine import chat_template_of
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.tokenizer import load_tokenizer
from workers.engine.weights import load_model_weights
from workers.server import create_app

HISTORY = [
    {
        "role": "system",
        "content": "You are a concise assistant who answers questions about cooking.",
    },
    {"role": "user", "content": "I have flour, eggs, milk, butter and sugar. What can I bake?"},
    {
        "role": "assistant",
        "content": "You can bake crepes, pancakes, a simple sponge cake, butter cookies or a "
        "clafoutis if you add fruit. Crepes need only whisking and a hot pan; a sponge cake "
        "needs the eggs beaten with the sugar until pale, then the flour folded in gently.",
    },
    {"role": "user", "content": "How long should a sponge cake bake, and at what temperature?"},
    {
        "role": "assistant",
        "content": "Bake a 20 cm sponge at 180 degrees Celsius for 25 to 30 minutes, until the "
        "top springs back and a skewer comes out clean. Do not open the oven in the first 20 "
        "minutes or the cake may sink.",
    },
]


@pytest.fixture(scope="module")
async def client(smollm2_gguf: Path) -> AsyncIterator[tuple[httpx.AsyncClient, TorchEngine]]:
    config, state = load_model_weights(smollm2_gguf)
    engine = TorchEngine(
        config, state, EngineOptions(device="cpu", kv_pool_bytes=64 * 2**20), model_id=DEFAULT_MODEL
    )
    tokenizer = load_tokenizer(smollm2_gguf)
    app = create_app(engine, tokenizer, chat_template_of(tokenizer))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://w", timeout=300
        ) as c:
            yield c, engine
    finally:
        engine.close()


async def ask(client: httpx.AsyncClient, messages: list[dict]) -> dict:
    body = {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 24, "temperature": 0}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.slow
async def test_second_turn_reuses_history_and_matches_a_cold_run(
    client: tuple[httpx.AsyncClient, TorchEngine],
) -> None:
    http, engine = client
    engine.flush_cache()
    turn1 = [*HISTORY, {"role": "user", "content": "Can I replace the butter with oil?"}]
    first = await ask(http, turn1)
    assert cached(first) == 0
    answer = first["choices"][0]["message"]["content"]
    assert answer.strip()

    turn2 = [
        *turn1,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks!"},
    ]
    warm = await ask(http, turn2)
    # Everything up to the last full page of turn 1's prompt comes from the cache.
    assert cached(warm) >= first["usage"]["prompt_tokens"] // 16 * 16 - 16 > 0

    engine.flush_cache()
    cold = await ask(http, turn2)
    assert cached(cold) == 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert warm["usage"]["prompt_tokens"] == cold["usage"]["prompt_tokens"]
