"""The worker's HTTP surface over a real engine (tiny random Llama, SmolLM2's tokenizer)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.worker import GREEDY, MODEL, TINY_CONTEXT, complete
from workers.engine.engine import TorchEngine
from workers.engine.tokenizer import load_tokenizer


def sse_payloads(body: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


async def test_completion_reports_text_and_usage(worker_client: httpx.AsyncClient) -> None:
    resp = await complete(worker_client, prompt="The capital of France is", max_tokens=8, **GREEDY)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion"
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert isinstance(choice["text"], str) and choice["text"]
    usage = body["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    details = usage["prompt_tokens_details"]
    assert set(details["cached_tokens_by_tier"]) == {"device", "host", "nas", "object"}
    assert sum(details["cached_tokens_by_tier"].values()) == details["cached_tokens"]


async def test_token_id_prompt_equals_text_prompt(
    worker_client: httpx.AsyncClient, smollm2_gguf: Path
) -> None:
    prompt_ids = load_tokenizer(smollm2_gguf).encode("Once upon a time")
    text = await complete(worker_client, prompt="Once upon a time", max_tokens=6, **GREEDY)
    ids = await complete(worker_client, prompt=prompt_ids, max_tokens=6, **GREEDY)
    assert ids.json()["choices"][0]["text"] == text.json()["choices"][0]["text"]


async def test_stop_string_cuts_output_before_it(worker_client: httpx.AsyncClient) -> None:
    full = (await complete(worker_client, prompt="A list:", max_tokens=24, **GREEDY)).json()
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"greedy output too uniform to pick a stop string: {text!r}"
    cut = (
        await complete(worker_client, prompt="A list:", max_tokens=24, stop=[stop], **GREEDY)
    ).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop)]
    assert stop not in choice["text"]


async def test_streamed_completion_matches_whole_and_ends_with_done(
    worker_client: httpx.AsyncClient,
) -> None:
    whole = (await complete(worker_client, prompt="Hello", max_tokens=10, **GREEDY)).json()
    resp = await complete(
        worker_client,
        prompt="Hello",
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []  # the usage chunk
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_a_stream_can_carry_the_usage_so_far_on_every_chunk(
    worker_client: httpx.AsyncClient,
) -> None:
    """``continuous_usage_stats`` (as in SGLang and vLLM): what a gateway meters a stream
    cut short by, since the usage chunk at the end never comes then."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    resp = await complete(
        worker_client, prompt="Hello", max_tokens=6, stream=True, stream_options=options, **GREEDY
    )
    chunks = [json.loads(p) for p in sse_payloads(resp.text)[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == sorted(counts) and counts[-1] == 6 and counts[0] >= 1
    assert all(c["usage"]["prompt_tokens"] == chunks[-1]["usage"]["prompt_tokens"] for c in chunks)


async def test_native_generate_reports_meta_info(worker_client: httpx.AsyncClient) -> None:
    req = {"text": "Hello", "sampling_params": {"max_new_tokens": 5, **GREEDY}}
    body = (await worker_client.post("/generate", json=req)).json()
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 5 and len(body["output_ids"]) == 5
    assert meta["finish_reason"] == {"type": "length"}
    assert meta["prompt_tokens"] > 0
    assert set(meta["cached_tokens_by_tier"]) == {"device", "host", "nas", "object"}

    resp = await worker_client.post("/generate", json={**req, "stream": True})
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    last = json.loads(payloads[-2])
    assert last["text"] == body["text"]  # SGLang streams the cumulative text
    assert last["meta_info"]["finish_reason"] == {"type": "length"}


async def test_second_identical_request_is_served_from_cache(
    worker_client: httpx.AsyncClient,
) -> None:
    prompt = "Paging test. " * 12  # several pages
    first = (await complete(worker_client, prompt=prompt, max_tokens=4, **GREEDY)).json()
    second = (await complete(worker_client, prompt=prompt, max_tokens=4, **GREEDY)).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["choices"][0]["text"] == first["choices"][0]["text"]


async def test_request_id_header_is_echoed(worker_client: httpx.AsyncClient) -> None:
    resp = await worker_client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 1},
        headers={"x-request-id": "req-123"},
    )
    assert resp.headers["x-request-id"] == "req-123"
    assert resp.json()["id"] == "cmpl-req-123"


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": 10**9},
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": TINY_CONTEXT},
            400,
            f"{TINY_CONTEXT}-token context",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": [5] * (TINY_CONTEXT + 1)},
            400,
            "shorten the prompt",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": [49152]}, 400, "token ids must be in"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "n": 9},
            400,
            "less than or equal to 8",
        ),
        ("/generate", {"text": "x", "input_ids": [1]}, 400, "exactly one"),
        (
            "/generate",
            {"text": "x", "sampling_params": {"max_new_tokens": 0}},
            400,
            "max_new_tokens",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(
    worker_client: httpx.AsyncClient, path: str, body: object, status: int, words: str
) -> None:
    if isinstance(body, bytes):
        resp = await worker_client.post(path, content=body)
    else:
        resp = await worker_client.post(path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert words in error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


async def test_models_health_info_and_loads(worker_client: httpx.AsyncClient) -> None:
    models = (await worker_client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert (await worker_client.get("/health")).status_code == 200
    assert (await worker_client.get("/health_generate")).status_code == 200
    info = (await worker_client.get("/server_info")).json()
    assert info["model_id"] == MODEL and info["context_length"] == TINY_CONTEXT
    loads = (await worker_client.get("/v1/loads")).json()["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["num_total_pages"] > 0


async def test_metrics_count_tokens_and_read_the_engine(worker_client: httpx.AsyncClient) -> None:
    await complete(worker_client, prompt="metrics", max_tokens=3, **GREEDY)
    text = (await worker_client.get("/metrics")).text
    for name in (
        "kvgate_worker_queue_length",
        "kvgate_worker_running_requests",
        "kvgate_worker_pool_usage_ratio",
        'kvgate_worker_cached_tokens_total{tier="device"}',
        "kvgate_worker_prefill_tokens_per_second",
        "kvgate_worker_decode_tokens_per_second",
    ):
        assert name in text
    generated = next(
        line
        for line in text.splitlines()
        if line.startswith("kvgate_worker_generation_tokens_total")
    )
    assert float(generated.split()[-1]) >= 3


def _counter(metrics: httpx.Response, name: str) -> float:
    return float(next(x for x in metrics.text.splitlines() if x.startswith(name + " ")).split()[1])


async def test_flush_cache_and_abort_unknown(
    worker_client: httpx.AsyncClient, worker_engine: TorchEngine
) -> None:
    await complete(worker_client, prompt="to be flushed " * 8, max_tokens=2, **GREEDY)
    assert worker_engine.load().cached_pages > 0
    before = _counter(await worker_client.get("/metrics"), "kvgate_worker_evicted_pages_total")
    resp = await worker_client.post("/flush_cache")
    assert resp.status_code == 200
    assert worker_engine.load().cached_pages == 0
    metrics = await worker_client.get("/metrics")
    # a flush drops pages on request; only evictions that make room count
    assert _counter(metrics, "kvgate_worker_evicted_pages_total") == before
    assert before == worker_engine.stats().evicted_pages
    assert _counter(metrics, "kvgate_worker_preemptions_total") == worker_engine.stats().preemptions
    resp = await worker_client.post("/abort_request", json={"rid": "no-such-request"})
    assert resp.json() == {"rid": "no-such-request", "aborted": False}


async def test_a_flush_waiting_for_a_step_does_not_stall_the_worker(
    worker_client: httpx.AsyncClient, worker_engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a step runs (here: its lock held by another thread), a flush waits for it off
    the event loop: the worker keeps answering meanwhile."""
    holding, done, flushing = threading.Event(), threading.Event(), threading.Event()
    flush_cache = worker_engine.flush_cache

    def flush_noting_it() -> bool:
        flushing.set()
        return flush_cache()

    monkeypatch.setattr(worker_engine, "flush_cache", flush_noting_it)

    def step() -> None:
        with worker_engine._step_lock:
            holding.set()
            done.wait(10)  # the flush is answered after this either way

    holder = threading.Thread(target=step)
    holder.start()
    try:
        await asyncio.to_thread(holding.wait, 10)
        flush = asyncio.create_task(worker_client.post("/flush_cache"))
        await asyncio.to_thread(flushing.wait, 10)  # it waits for the step now
        health = await worker_client.get("/health")
        assert health.status_code == 200 and not flush.done()
    finally:
        done.set()
        await asyncio.to_thread(holder.join)
    assert (await flush).status_code == 200


async def chat(client: httpx.AsyncClient, **fields: object) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": MODEL, **fields})


HELLO = [{"role": "user", "content": "Hello!"}]


async def test_chat_completion_applies_the_template(worker_client: httpx.AsyncClient) -> None:
    resp = await chat(worker_client, messages=HELLO, max_tokens=6, **GREEDY)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    # SmolLM2's template adds a default system turn: far more prompt tokens than "Hello!".
    assert body["usage"]["prompt_tokens"] > 20


async def test_chat_stream_opens_with_the_role_and_ends_with_done(
    worker_client: httpx.AsyncClient,
) -> None:
    whole = (await chat(worker_client, messages=HELLO, max_tokens=6, **GREEDY)).json()
    resp = await chat(worker_client, messages=HELLO, max_tokens=6, stream=True, **GREEDY)
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in chunks[-1]  # no include_usage, no usage


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": "Hello"}, "messages", "valid list"),
        ({"messages": [{"role": "user"}]}, "messages.0", "needs 'content'"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role", "required"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", "unknown role"),
        ({"messages": HELLO, "max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
        ({"messages": HELLO, "max_completion_tokens": 10**8}, "max_completion_tokens", "less than"),
        ({"messages": HELLO, "max_tokens": TINY_CONTEXT}, "max_tokens", "context"),
        ({"messages": [{"role": "user", "content": "hi " * TINY_CONTEXT}]}, "messages", "shorten"),
        ({"messages": HELLO, "top_logprobs": 3}, "top_logprobs", "'logprobs': true"),
    ],
)
async def test_bad_chat_requests_get_400_with_a_message(
    worker_client: httpx.AsyncClient, fields: dict, param: str | None, words: str
) -> None:
    resp = await chat(worker_client, **fields)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


async def test_chat_for_an_unknown_model_is_404_model_not_found(
    worker_client: httpx.AsyncClient,
) -> None:
    resp = await worker_client.post(
        "/v1/chat/completions", json={"model": "nope", "messages": HELLO}
    )
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert "'nope'" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tools"),
        (
            {
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": None},
                    {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
                ]
            },
            "messages",
            "tool results",
        ),
    ],
)
async def test_what_the_engine_cannot_do_is_a_400_that_says_so(
    worker_client: httpx.AsyncClient, extra: dict, param: str, words: str
) -> None:
    """Never a 200 that silently ignored the field (a template internal leaked before)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = await worker_client.post("/v1/chat/completions", json=body | extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


async def test_response_format_text_is_what_it_always_was(worker_client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = await worker_client.post(
        "/v1/chat/completions", json=body | {"response_format": {"type": "text"}}
    )
    assert response.status_code == 200, response.text


async def test_fit_context_caps_the_answer_at_what_the_context_leaves(
    worker_client: httpx.AsyncClient,
) -> None:
    prompt = "word " * 200
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 100_000, **GREEDY}
    refused = await worker_client.post("/v1/completions", json=body)
    assert refused.status_code == 400  # asked for more than the context has
    fitted = await worker_client.post("/v1/completions", json=body | {"fit_context": True})
    assert fitted.status_code == 200, fitted.text
    usage = fitted.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == TINY_CONTEXT


async def test_n_choices_share_one_prompt_and_are_billed_for_it_once(
    worker_client: httpx.AsyncClient,
) -> None:
    prompt = "Tell me a story about caches: " + "word " * 40
    before = await _prefill_tokens(worker_client)
    three = await complete(worker_client, prompt=prompt, max_tokens=6, n=3, **GREEDY)
    assert three.status_code == 200, three.text
    computed = await _prefill_tokens(worker_client) - before
    body = three.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({c["text"] for c in body["choices"]}) == 1  # greedy: the same answer thrice
    usage = body["usage"]
    one = (await complete(worker_client, prompt=prompt, max_tokens=6, **GREEDY)).json()
    assert usage["prompt_tokens"] == one["usage"]["prompt_tokens"]  # counted once
    assert usage["completion_tokens"] == 3 * 6
    # choices 2 and 3 found the prompt in the cache: it was computed once, not thrice
    assert computed < 2 * usage["prompt_tokens"]


async def test_n_choices_stream_interleaved_by_index_with_one_usage(
    worker_client: httpx.AsyncClient,
) -> None:
    response = await worker_client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "seed": 7,
            "temperature": 1.0,
            "ignore_eos": True,
        },
    )
    assert response.status_code == 200, response.text
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    finished = {
        c["choices"][0]["index"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    }
    assert finished == {0, 1}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


async def _prefill_tokens(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return float(re.search(r"^kvgate_worker_prefill_tokens_total (\S+)", text, re.M).group(1))
