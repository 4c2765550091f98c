"""Tools through the worker's chat route, on a model whose chat template takes them: the tiny
random Llama with SmolLM2's vocabulary and a Qwen 2.5-style (Hermes) template. Random
weights only call tools when the grammar makes them; what is checked is the parsing and the
shapes, streamed and whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from starlette.applications import Starlette

from kvgate.wiring.engine import chat_template_of
from protocol.openai_requests import ChatCompletionRequest, validate
from tests.support.worker import MODEL
from tests.workers.test_http import sse_payloads
from workers.constraints import template_messages
from workers.engine.chat_template import ChatTemplate
from workers.engine.engine import TorchEngine
from workers.engine.tokenizer import load_tokenizer
from workers.server import create_app

#: Qwen 2.5's template, in its essentials: tools in the system turn, calls as <tool_call>
#: blocks, results as <tool_response> blocks in a user turn
HERMES_TEMPLATE = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

#: bounded arguments, so that random weights close every call
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "Weather in Paris for 3 days, and the time?"}]


@pytest.fixture(scope="module")
def app(worker_engine: TorchEngine, smollm2_gguf: Path) -> Starlette:
    tokenizer = load_tokenizer(smollm2_gguf)
    tokenizer.chat_template = HERMES_TEMPLATE
    return create_app(worker_engine, tokenizer, chat_template_of(tokenizer))


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://w") as c:
        yield c


async def _chat(client: httpx.AsyncClient, **fields: object) -> dict:
    body = {"model": MODEL, "messages": USER, "tools": TOOLS, "max_tokens": 160} | fields
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _check_calls(calls: list[dict], names: set[str]) -> None:
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in names
        jsonschema.validate(
            json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]]
        )


@pytest.mark.parametrize(("temperature", "parallel"), [(0.0, None), (1.0, False), (1.0, None)])
async def test_required_makes_calls_that_follow_the_schemas(
    client: httpx.AsyncClient, temperature: float, parallel: bool | None
) -> None:
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    body = await _chat(client, tool_choice="required", temperature=temperature, seed=3, **fields)
    choice = body["choices"][0]
    calls = choice["message"]["tool_calls"]
    _check_calls(calls, set(SCHEMAS))
    if parallel is False:
        assert len(calls) == 1
    # sampled random weights may go on calling (each call may be followed by another)
    # until max_tokens cuts one (its start stays text); a reply that ended by itself is
    # calls alone and says so
    if choice["finish_reason"] != "length" or not temperature or parallel is False:
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None


async def test_a_named_function_is_the_one_call(client: httpx.AsyncClient) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    body = await _chat(client, tool_choice=choice, temperature=1.0, seed=1)
    calls = body["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1
    _check_calls(calls, {"get_time"})


async def test_none_and_auto_leave_the_reply_text(client: httpx.AsyncClient) -> None:
    """Random weights write no call of their own: the reply is text, with no tool_calls."""
    without = await _chat(client, tools=None, max_tokens=4)
    none = await _chat(client, tool_choice="none", max_tokens=4)
    auto = await _chat(client, tool_choice="auto", max_tokens=4)
    # none renders no tools (the model is not tempted); auto shows them to the model
    assert none["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]
    assert auto["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]
    for body in (none, auto):
        message = body["choices"][0]["message"]
        assert "tool_calls" not in message and isinstance(message["content"], str)
        assert body["choices"][0]["finish_reason"] == "length"


async def test_streamed_calls_come_in_deltas_and_match_the_whole_reply(
    client: httpx.AsyncClient,
) -> None:
    whole = await _chat(client, tool_choice="required", temperature=0.0)
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "tools": TOOLS, "max_tokens": 160}
        | {"tool_choice": "required", "temperature": 0.0, "stream": True},
    )
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    streamed = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [c["index"] for c in streamed] == list(range(len(streamed)))
    expected = whole["choices"][0]["message"]["tool_calls"]
    assert [c["function"] for c in streamed] == [c["function"] for c in expected]
    assert not any(d.get("content") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_tool_result_turn_is_rendered_and_answered(client: httpx.AsyncClient) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    body = await _chat(client, messages=history, max_tokens=4)
    shorter = await _chat(client, messages=USER, max_tokens=4)
    assert body["usage"]["prompt_tokens"] > shorter["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"response_format": {"type": "json_object"}}, "response_format", "either"),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{"}}]}]}, "messages.1.tool_calls", "JSON"),
    ],
)  # fmt: skip
async def test_tool_requests_that_cannot_be_served_are_400s(
    client: httpx.AsyncClient, fields: dict, param: str, words: str
) -> None:
    body = {"model": MODEL, "messages": USER, "tools": TOOLS} | fields
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_earlier_calls_render_with_their_arguments_as_objects() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    body = validate(
        ChatCompletionRequest,
        {
            "model": MODEL,
            "tools": TOOLS,
            "messages": [
                *USER,
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
            ],
        },
    )
    prompt = ChatTemplate(HERMES_TEMPLATE)(template_messages(body), tools=TOOLS)
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>' in prompt
    assert "<tool_response>\n12:00\n</tool_response>" in prompt
    assert '"name": "get_weather"' in prompt  # the tools, in the system turn
