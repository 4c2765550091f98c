"""A chained response lands on the KV pages its conversation left.

The built-in worker (the tiny random Llama with SmolLM2's tokenizer and chat template,
served in-process) behind a real gateway process: a follow-up naming
``previous_response_id`` reports the earlier turn's prompt as cached, and the same
history resent as a chat completion is the same token sequence (as many prompt tokens, all
of them found in the cache the follow-up left).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import openai
import pytest
from starlette.applications import Starlette

from tests.support.gateway import (
    deregister,
    gateway_process,
    register_workers,
    team_key,
    unique,
)
from tests.support.worker import MODEL, serving

#: the engine's page: only whole pages are found in its cache
PAGE = 16


@pytest.fixture
async def client(
    pg_dsn: str, pg_pool: asyncpg.Pool, worker_asgi_app: Starlette
) -> AsyncIterator[openai.AsyncOpenAI]:
    # Another module may have left tiny-random workers registered; this test routes to its own.
    await pg_pool.execute("DELETE FROM workers WHERE model = $1", MODEL)
    worker = unique("w-resp-kv")
    async with serving(worker_asgi_app) as url:
        await register_workers(pg_pool, MODEL, {worker: url})
        _, key = await team_key(pg_pool)
        with gateway_process(pg_dsn) as (gateway, _):
            yield openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=key, max_retries=0)
        await deregister(pg_pool, [worker])


def _whole_pages(tokens: int) -> int:
    """Cached tokens a prompt of ``tokens`` may find at least (the last one is computed)."""
    return (tokens - 1) // PAGE * PAGE


async def test_a_follow_up_finds_its_conversation_in_the_cache(
    client: openai.AsyncOpenAI,
) -> None:
    instructions = "You answer in one short sentence."
    opening = "Tell me about the sea and the ships that sail on it. " * 4
    one = await client.responses.create(
        model=MODEL, input=opening, instructions=instructions, max_output_tokens=6, temperature=0
    )
    assert one.usage.input_tokens > 2 * PAGE
    events = [
        event
        async for event in await client.responses.create(
            model=MODEL,
            input="And the sky above it?",
            instructions=instructions,
            previous_response_id=one.id,
            max_output_tokens=4,
            temperature=0,
            stream=True,
        )
    ]
    two = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    cached = two.usage.input_tokens_details.cached_tokens
    assert _whole_pages(one.usage.input_tokens) <= cached < two.usage.input_tokens

    resent = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": instructions},
            {"role": "user", "content": opening},
            {"role": "assistant", "content": one.output_text},
            {"role": "user", "content": "And the sky above it?"},
        ],
        max_tokens=1,
        temperature=0,
    )
    assert resent.usage.prompt_tokens == two.usage.input_tokens
    resent_cached = resent.usage.prompt_tokens_details.cached_tokens
    assert resent_cached >= _whole_pages(two.usage.input_tokens)
