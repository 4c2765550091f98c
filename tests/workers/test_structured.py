"""Structured outputs through the worker's OpenAI routes: ``response_format`` json_object and
json_schema, streamed or not, greedy or sampled (tiny random Llama, SmolLM2's tokenizer)."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest

from tests.support.worker import MODEL
from tests.workers.test_http import sse_payloads

#: every value bounded, so that even random weights reach the end of the object (strings by
#: a pattern: xgrammar 0.2 lets raw control characters into maxLength strings, not JSON)
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "sunny": {"type": "boolean"},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "sunny", "unit"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "forecast", "schema": SCHEMA, "strict": True},
}


def _chat(prompt: str, **fields: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 120,
    } | fields


async def _content(client: httpx.AsyncClient, body: dict) -> tuple[str, str]:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


async def test_json_schema_replies_validate_greedy_and_sampled(
    worker_client: httpx.AsyncClient,
) -> None:
    prompts = ["Weather in Paris?", "Forecast for Oslo", "Rain?", "Give me JSON"]
    bodies = [_chat(p, temperature=0.0, response_format=JSON_SCHEMA) for p in prompts]
    bodies += [
        _chat(p, temperature=1.0, seed=i, response_format=JSON_SCHEMA)
        for i, p in enumerate(prompts)
    ]
    replies = await asyncio.gather(*(_content(worker_client, b) for b in bodies))
    for content, reason in replies:
        assert reason == "stop"
        jsonschema.validate(json.loads(content), SCHEMA)


async def test_json_object_replies_are_objects(worker_client: httpx.AsyncClient) -> None:
    """Random weights may wander through keys until max_tokens (any object is allowed, and
    ``tests/workers/engine/test_grammar.py`` shows only objects are); a reply that ended by
    itself parses as one."""
    bodies = [
        _chat(p, temperature=t, seed=1, response_format={"type": "json_object"})
        for p in ("JSON please", "{", "Data")
        for t in (0.0, 1.0)
    ]
    for content, reason in await asyncio.gather(*(_content(worker_client, b) for b in bodies)):
        assert content.lstrip().startswith("{") and reason in ("stop", "length")
        if reason == "stop":
            assert isinstance(json.loads(content), dict)


async def test_streamed_json_schema_is_the_same_reply(worker_client: httpx.AsyncClient) -> None:
    body = _chat("Weather?", temperature=0.0, response_format=JSON_SCHEMA)
    whole, _ = await _content(worker_client, body)
    response = await worker_client.post("/v1/chat/completions", json=body | {"stream": True})
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_structured_requests_batch_beside_free_ones(worker_client: httpx.AsyncClient) -> None:
    free = _chat("Tell me a story", temperature=0.0, max_tokens=16, ignore_eos=True)
    alone, _ = await _content(worker_client, free)
    results = await asyncio.gather(
        _content(worker_client, free),
        *(
            _content(worker_client, _chat(f"q{i}", seed=i, response_format=JSON_SCHEMA))
            for i in range(3)
        ),
    )
    assert results[0][0] == alone
    for content, _ in results[1:]:
        jsonschema.validate(json.loads(content), SCHEMA)


async def test_each_of_n_choices_follows_the_schema(worker_client: httpx.AsyncClient) -> None:
    body = _chat("Weather?", n=3, seed=5, response_format=JSON_SCHEMA)
    response = await worker_client.post("/v1/chat/completions", json=body)
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for choice in choices:
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


async def test_a_completion_takes_a_response_format_too(worker_client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "JSON:", "max_tokens": 120, "response_format": JSON_SCHEMA}
    response = await worker_client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    jsonschema.validate(json.loads(response.json()["choices"][0]["text"]), SCHEMA)


async def test_max_tokens_cuts_a_structured_reply(worker_client: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"essay": {"type": "string"}}, "required": ["essay"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "essay", "schema": schema}}
    response = await worker_client.post(
        "/v1/chat/completions", json=_chat("Write", max_tokens=6, response_format=fmt)
    )
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}}, "response_format", 'Unsupported type "colour"'),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/defs/no"}}}, "response_format", "no"),
        ({"type": "json_schema"}, "response_format", "needs 'json_schema'"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name", "pattern"),
        ({"type": "yaml"}, "response_format.type", "'json_schema'"),
    ],
)  # fmt: skip
async def test_a_schema_that_cannot_be_followed_is_a_400_naming_the_problem(
    worker_client: httpx.AsyncClient, response_format: dict, param: str, words: str
) -> None:
    response = await worker_client.post(
        "/v1/chat/completions", json=_chat("hi", response_format=response_format)
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]
