"""The worker over real HTTP (uvicorn): disconnects, aborts, a crowded pool, the openai client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.worker import serving, tiny_engine, tiny_pool_bytes, wait_for, worker_app
from workers.engine.engine import TorchEngine

MODEL = "tiny-random"
GREEDY = {"temperature": 0.0, "ignore_eos": True}
PAGE = 16


@pytest.fixture(scope="module")
def engine() -> Iterator[TorchEngine]:
    engine = tiny_engine(kv_pool_bytes=4 * 2**20, page_size=PAGE)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
async def base_url(engine: TorchEngine, smollm2_gguf: Path) -> AsyncIterator[str]:
    async with serving(worker_app(engine, smollm2_gguf)) as url:
        yield url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        yield c


def idle(engine: TorchEngine, used_pages: int) -> bool:
    """Nothing runs or waits, and with the cache emptied the pool is back to ``used_pages``
    (a prompt's pages are cached once prefilled: an ended request leaves them there,
    unpinned, and nothing else)."""
    load = engine.load()
    if load.running or load.queued or not engine.flush_cache():
        return False
    return engine.load().pool_used_pages == used_pages


async def stream_lines(
    client: httpx.AsyncClient, body: dict, headers: dict | None = None
) -> AsyncIterator[str]:
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                yield line[len("data: ") :]


LONG = {"model": MODEL, "prompt": "Tell me a long story. " * 4, "max_tokens": 400, **GREEDY}


async def test_streaming_client_that_disconnects_frees_its_pages(
    client: httpx.AsyncClient, engine: TorchEngine
) -> None:
    engine.flush_cache()
    before = engine.load().pool_used_pages
    lines = stream_lines(client, {**LONG, "stream": True})
    async for _ in lines:
        if engine.load().pool_used_pages > before:
            break  # the request holds pages now
    await lines.aclose()  # closes the connection mid-stream
    await wait_for(lambda: idle(engine, before))


async def test_non_streaming_client_that_disconnects_frees_its_pages(
    client: httpx.AsyncClient, engine: TorchEngine
) -> None:
    engine.flush_cache()
    before = engine.load().pool_used_pages
    task = asyncio.create_task(client.post("/v1/completions", json=LONG))
    await wait_for(lambda: engine.load().running == 1)
    task.cancel()  # the client gives up and closes the connection
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: idle(engine, before))


async def test_abort_request_ends_the_stream_and_frees_its_pages(
    client: httpx.AsyncClient, engine: TorchEngine
) -> None:
    engine.flush_cache()
    before = engine.load().pool_used_pages
    chunks = []
    async for payload in stream_lines(client, {**LONG, "stream": True}, {"x-request-id": "r-1"}):
        if payload == "[DONE]":
            break
        chunks.append(json.loads(payload))
        if len(chunks) == 2:
            resp = await client.post("/abort_request", json={"rid": "r-1"})
            assert resp.json() == {"rid": "r-1", "aborted": True}
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert len(chunks) < LONG["max_tokens"]
    await wait_for(lambda: idle(engine, before))


async def test_sixteen_concurrent_streams_share_a_pool_too_small_for_all(
    smollm2_gguf: Path,
) -> None:
    # 16 requests of 64 shared + 16 own prompt tokens and 48 generated need 8 pages each
    # (128 in all, 68 with the shared prefix counted once); the pool holds 40.
    small = tiny_engine(kv_pool_bytes=tiny_pool_bytes(40, PAGE), page_size=PAGE, max_batch=16)
    assert small.load().pool_total_pages == 40
    shared = list(range(1000, 1064))
    prompts = [shared + list(range(2000 + 16 * i, 2016 + 16 * i)) for i in range(16)]
    body = {"model": MODEL, "max_tokens": 48, **GREEDY}
    try:
        async with (
            serving(worker_app(small, smollm2_gguf)) as url,
            httpx.AsyncClient(base_url=url, timeout=120) as client,
        ):
            solo = []
            for prompt in prompts:
                resp = await client.post("/v1/completions", json={**body, "prompt": prompt})
                solo.append(resp.json()["choices"][0]["text"])
            small.flush_cache()
            before = small.stats()

            async def streamed(prompt: list[int]) -> tuple[str, str | None]:
                text, reason = "", None
                async for payload in stream_lines(
                    client, {**body, "prompt": prompt, "stream": True}
                ):
                    if payload != "[DONE]":
                        choice = json.loads(payload)["choices"][0]
                        text += choice["text"]
                        reason = choice["finish_reason"]
                return text, reason

            queued: list[int] = []

            async def watch_queue() -> None:
                while True:
                    queued.append(small.load().queued)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch_queue())
            results = await asyncio.gather(*(streamed(p) for p in prompts))
            watcher.cancel()
        assert [reason for _, reason in results] == ["length"] * 16
        assert [text for text, _ in results] == solo
        # The pool really was too small: requests were preempted or waited for pages.
        assert small.stats().preemptions > before.preemptions or max(queued) > 0
    finally:
        small.close()


async def test_official_openai_client_works(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    messages = [{"role": "user", "content": "Say hi"}]
    reply = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens_details is not None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(parts) == reply.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 5
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=messages, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="unknown role"):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "robot", "content": "x"}], max_tokens=1
        )


async def test_a_request_id_already_running_is_refused_with_400(
    client: httpx.AsyncClient, engine: TorchEngine
) -> None:
    engine.flush_cache()
    before = engine.load().pool_used_pages
    headers = {"x-request-id": "twice"}
    first = asyncio.create_task(client.post("/v1/completions", json=LONG, headers=headers))
    await wait_for(lambda: engine.load().running == 1)
    resp = await client.post("/v1/completions", json={**LONG, "max_tokens": 1}, headers=headers)
    assert resp.status_code == 400
    assert "already in use" in resp.json()["error"]["message"]
    # A stream is answered once its first token is there, so a refusal before it is an
    # HTTP error too, not a 200 with the error in-band (a gateway retries only on status).
    streamed = {**LONG, "stream": True}
    async with client.stream("POST", "/v1/completions", json=streamed, headers=headers) as resp:
        assert resp.status_code == 400
        error = json.loads(await resp.aread())["error"]
    assert "already in use" in error["message"] and error["type"] == "invalid_request_error"
    assert (await client.post("/abort_request", json={"rid": "twice"})).json()["aborted"]
    assert (await first).json()["choices"][0]["finish_reason"] == "abort"
    await wait_for(lambda: idle(engine, before))
