"""Log-probabilities through the worker's OpenAI surface (the tiny random Llama with
SmolLM2's tokenizer, float32 throughout), and through the official ``openai`` SDK.

The values are checked against a recomputation: one forward pass of ``transformers`` on
the same weights over prompt + generated tokens, whose ids the native ``/generate`` route
reports for the same (seeded) request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from starlette.applications import Starlette
from transformers import LlamaConfig, LlamaForCausalLM

from kvgate.wiring.engine import chat_template_of
from tests.support.worker import GREEDY, MODEL, serving, tiny_engine
from workers.engine.engine import TorchEngine
from workers.engine.tokenizer import Tokenizer, load_tokenizer
from workers.engine.weights import tiny_random

MESSAGES = [{"role": "user", "content": "Name three colours."}]
#: a prompt after which the tiny model's next tokens are far from certain
PROMPT = "The capital of France is"
#: a sampled request: what is drawn is tempered and cut, what is reported is not
SAMPLED = {"temperature": 1.5, "top_p": 0.95, "seed": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker_engine() -> Iterator[TorchEngine]:
    """The worker's engine with float32 KV, so that a full forward pass agrees to 1e-4
    (the CPU default keeps KV in float16)."""
    engine = tiny_engine(kv_dtype="float32", kv_pool_bytes=8 * 2**20)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: Path) -> Tokenizer:
    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def reference() -> LlamaForCausalLM:
    """``transformers``' Llama with the engine's weights."""
    config, state = tiny_random()
    model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
    model.load_state_dict(state, strict=False)  # the LM head is tied to the embedding
    model.tie_weights()
    return model


def recomputed(model: LlamaForCausalLM, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """``[len(generated), vocab]``: the log-softmax before each generated token."""
    ids = prompt + generated
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return logits[len(prompt) - 1 : len(ids) - 1].log_softmax(-1)


async def generated_ids(client: httpx.AsyncClient, prompt: list[int], fields: dict) -> list[int]:
    """The token ids the native route generates for ``prompt`` with the sampling ``fields``
    (OpenAI names) of a one-choice request."""
    params = {
        "max_new_tokens": fields["max_tokens"],
        "temperature": fields["temperature"],
        "top_p": fields.get("top_p", 1.0),
        "sampling_seed": fields.get("seed"),
        "ignore_eos": fields["ignore_eos"],
    }
    resp = await client.post("/generate", json={"input_ids": prompt, "sampling_params": params})
    assert resp.status_code == 200, resp.text
    return resp.json()["output_ids"]


def chat_prompt(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(chat_template_of(tokenizer)(MESSAGES), add_special_tokens=False)


def shown(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """The generated ids whose text a completion shows (special tokens are left out)."""
    return [i for i in ids if not tokenizer.is_special(i)]


async def test_top_logprobs_match_a_recomputation(
    worker_client: httpx.AsyncClient, tokenizer: Tokenizer, reference: LlamaForCausalLM
) -> None:
    fields = {"max_tokens": 16, **SAMPLED}
    resp = await worker_client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "logprobs": True, "top_logprobs": 5, **fields},
    )
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    content = choice["logprobs"]["content"]
    prompt = chat_prompt(tokenizer)
    ids = await generated_ids(worker_client, prompt, fields)
    expected = recomputed(reference, prompt, ids)
    positions = [p for p, i in enumerate(ids) if not tokenizer.is_special(i)]
    assert len(content) == len(positions) > 0
    for pos, entry in zip(positions, content, strict=True):
        token = ids[pos]
        assert entry["bytes"] == list(tokenizer.token_bytes(token))
        assert entry["logprob"] == pytest.approx(float(expected[pos, token]), abs=1e-4)
        values, top_ids = expected[pos].topk(5)
        assert len(entry["top_logprobs"]) == 5
        assert [t["bytes"] for t in entry["top_logprobs"]] == [
            list(tokenizer.token_bytes(i)) for i in top_ids.tolist()
        ]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(
            values.tolist(), abs=1e-4
        )
    # the tokens join into the answer
    joined = b"".join(bytes(e["bytes"]) for e in content).decode("utf-8", errors="replace")
    assert joined == choice["message"]["content"]


async def test_completion_logprobs_match_a_recomputation_streamed_or_not(
    worker_client: httpx.AsyncClient, tokenizer: Tokenizer, reference: LlamaForCausalLM
) -> None:
    fields = {"max_tokens": 12, **SAMPLED}
    body = {"model": MODEL, "prompt": PROMPT, "logprobs": 3, **fields}
    whole = (await worker_client.post("/v1/completions", json=body)).json()["choices"][0]
    logprobs = whole["logprobs"]
    prompt = tokenizer.encode(PROMPT)
    ids = shown(tokenizer, await generated_ids(worker_client, prompt, fields))
    expected = recomputed(reference, prompt, ids)
    assert logprobs["tokens"] == [
        tokenizer.token_bytes(i).decode("utf-8", errors="replace") for i in ids
    ]
    for pos, (token, lp) in enumerate(zip(ids, logprobs["token_logprobs"], strict=True)):
        assert lp == pytest.approx(float(expected[pos, token]), abs=1e-4)
    for text, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
        assert text in top and 3 <= len(top) <= 4  # the generated token is always there
    lengths = [len(t) for t in logprobs["tokens"]]
    assert logprobs["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]

    resp = await worker_client.post("/v1/completions", json=body | {"stream": True})
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line[6:7] == "{"]
    parts = [c["choices"][0]["logprobs"] for c in chunks]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for part in parts for v in part[key]] == logprobs[key]


async def test_streamed_chat_chunks_carry_their_tokens_logprobs(
    worker_client: httpx.AsyncClient,
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "logprobs": True, **GREEDY}
    whole = (await worker_client.post("/v1/chat/completions", json=body)).json()
    entries = whole["choices"][0]["logprobs"]["content"]
    assert all(e["top_logprobs"] == [] for e in entries)  # top_logprobs absent: none
    resp = await worker_client.post("/v1/chat/completions", json=body | {"stream": True})
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line[6:7] == "{"]
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk has no token
    streamed = [e for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == entries


async def test_every_choice_has_its_own_logprobs(worker_client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "n": 3, "logprobs": 2, **SAMPLED}
    resp = await worker_client.post("/v1/completions", json=body)
    choices = resp.json()["choices"]
    texts = [c["text"] for c in choices]
    assert len(set(texts)) > 1, texts  # three draws, not one thrice
    for choice in choices:
        logprobs = choice["logprobs"]
        assert "".join(logprobs["tokens"]) == choice["text"]
        assert len(logprobs["token_logprobs"]) == 8
    plain = await worker_client.post(
        "/v1/completions", json={k: v for k, v in body.items() if k != "logprobs"}
    )
    assert all(c["logprobs"] is None for c in plain.json()["choices"])


async def test_the_openai_sdk_reads_logprobs(worker_asgi_app: Starlette) -> None:
    async with serving(worker_asgi_app) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0)
        extra = {"extra_body": {"ignore_eos": True}}
        chat = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=5,
            **extra,
        )
        content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
        assert len(content) == 6 and all(len(t.top_logprobs) == 5 for t in content)
        assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[4].logprob

        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=5,
            stream=True,
            **extra,
        )
        streamed = [
            t for chunk in [c async for c in stream] if chunk.choices and chunk.choices[0].logprobs
            for t in chunk.choices[0].logprobs.content or []
        ]  # fmt: skip
        assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]

        text = await client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=5, temperature=0, logprobs=2, **extra
        )
        logprobs = text.choices[0].logprobs
        assert logprobs is not None and len(logprobs.tokens or []) == 5
        assert all(2 <= len(top) <= 3 for top in logprobs.top_logprobs or [])

        stream_text = await client.completions.create(
            model=MODEL,
            prompt="Hello",
            max_tokens=5,
            temperature=0,
            logprobs=2,
            stream=True,
            **extra,
        )
        tokens = [
            t for chunk in [c async for c in stream_text]
            for t in (chunk.choices[0].logprobs.tokens or [])  # type: ignore[union-attr]
        ]  # fmt: skip
        assert tokens == logprobs.tokens

        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=2,
                top_logprobs=21,
                logprobs=True,
            )
        assert "top_logprobs" in str(err.value)
        await client.close()
