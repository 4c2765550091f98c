"""The official ``openai`` client through the gateway to built-in workers, for teams and
for the free tier (``api_key="EMPTY"``): what OpenAI parity promises.

Two real ``kvgate worker --model tiny-random`` processes (the built-in torch engine with a
seeded tiny random Llama on CPU) behind one gateway process; chat and text completions,
streaming and not.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import asyncpg
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion

from kvgate.stack.ports import free_port
from tests.support.gateway import (
    KVGATE,
    apoll,
    deregister,
    free_tier_address,
    gateway_process,
    process,
    register_workers,
    team_key,
    unique,
    wait_http,
)

MODEL = "tiny-random"


@contextlib.contextmanager
def builtin_worker() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``kvgate worker --model tiny-random`` process, started but not yet ready."""
    port = free_port()
    args = [*KVGATE, "worker"]
    args += ["--model", MODEL, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    env = {"KVGATE_HOME": f"/tmp/kvgate-gw-{port}"}
    with process(args, url + "/v1/models", env, wait=False) as proc:
        yield url, proc


@dataclass
class Rig:
    client: openai.OpenAI
    team_id: int
    url: str


@pytest.fixture(scope="module")
async def rig(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[Rig]:
    ids = [unique("w-builtin") for _ in range(2)]
    # Other test modules may have registered tiny-random workers; this test owns the model
    # name while it runs, so earlier leftovers are cleared first.
    await pg_pool.execute("DELETE FROM workers WHERE model = $1", MODEL)
    with contextlib.ExitStack() as stack:
        started = {i: stack.enter_context(builtin_worker()) for i in ids}
        for url, proc in started.values():
            # Loading torch and building the engine takes a while on a shared CPU.
            wait_http(url + "/v1/models", 180, proc=proc)
        urls = {i: url for i, (url, _) in started.items()}
        await register_workers(pg_pool, MODEL, urls)
        team_id, key = await team_key(pg_pool)
        gw, _ = stack.enter_context(gateway_process(pg_dsn))
        client = openai.OpenAI(base_url=gw + "/v1", api_key=key, max_retries=0, timeout=60)
        yield Rig(client, team_id, gw)
    await deregister(pg_pool, ids)


def test_models_lists_the_builtin_model(rig: Rig) -> None:
    assert MODEL in [m.id for m in rig.client.models.list()]


def test_chat_and_completions_not_streaming(rig: Rig) -> None:
    chat = rig.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        seed=1,
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 4 and chat.usage.prompt_tokens > 0
    text = rig.client.completions.create(model=MODEL, prompt="Once upon", max_tokens=3)
    assert text.usage.completion_tokens == 3 and isinstance(text.choices[0].text, str)


def test_chat_and_completions_streaming(rig: Rig) -> None:
    chunks = list(
        rig.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count."}],
            max_tokens=5,
            stream=True,
            extra_body={"min_tokens": 5, "top_k": 3},
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"

    chunks = list(
        rig.client.completions.create(
            model=MODEL,
            prompt="Once upon",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert sum(1 for c in chunks if c.choices) == 3


async def test_usage_rows_record_the_workers_token_counts(rig: Rig, pg_pool: asyncpg.Pool) -> None:
    rig.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
    )
    rows = await apoll(
        lambda: pg_pool.fetch(
            "SELECT completion_tokens, prompt_tokens, worker FROM usage WHERE team_id = $1",
            rig.team_id,
        ),
        lambda rows: len(rows) >= 5,
        what="usage rows of this module's requests",
    )
    assert all(r["prompt_tokens"] > 0 and r["worker"].startswith("w-builtin") for r in rows)
    assert sorted(r["completion_tokens"] for r in rows) == [2, 3, 3, 4, 5]


#: a schema whose every valid answer is short, so a random model completes it
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
    },
    "required": ["colour", "ok", "name"],
    "additionalProperties": False,
}


def free(rig: Rig) -> openai.OpenAI:
    """The SDK as a free-tier user runs it: a placeholder key, from an address of its own
    (the gateway believes loopback's X-Forwarded-For) so each test has its own limits."""
    return openai.OpenAI(
        base_url=rig.url + "/v1",
        api_key="EMPTY",
        max_retries=0,
        timeout=60,
        default_headers={"x-forwarded-for": free_tier_address()},
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_answers_validate_for_the_free_tier(rig: Rig, temperature: float) -> None:
    form = {
        "type": "json_schema",
        "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True},
    }

    def ask(i: int) -> ChatCompletion:
        return free(rig).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Describe thing number {i}."}],
            response_format=form,
            max_tokens=64,
            temperature=temperature,
            seed=i,
        )

    # four at a time, so the workers batch constrained rows together
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(20)))
    for chat in answers:
        choice = chat.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_and_unknown_schema_types(rig: Rig) -> None:
    chat = free(rig).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Some JSON, please."}],
        response_format={"type": "json_object"},
        max_tokens=48,
        temperature=0,
    )
    content = chat.choices[0].message.content
    assert content.lstrip().startswith("{")
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        free(rig).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], response_format=bad
        )
    assert "colour" in refused.value.message


def test_tools_on_a_template_without_them_is_a_400_saying_so(rig: Rig) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        free(rig).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], tools=[tool]
        )
    assert "tool" in refused.value.message.lower()


def test_n_choices_count_the_prompt_once(rig: Rig) -> None:
    asked = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}]}
    one = free(rig).chat.completions.create(**asked, max_tokens=3)
    three = free(rig).chat.completions.create(
        **asked, max_tokens=3, n=3, temperature=1, seed=2, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in three.choices) == [0, 1, 2]
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * 3


def test_logprobs_give_five_alternatives_per_token(rig: Rig) -> None:
    chat = free(rig).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for token in content:
        values = [alt.logprob for alt in token.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert token.logprob <= values[0]


def test_responses_stream_and_chain_onto_cached_pages(rig: Rig) -> None:
    client = free(rig)
    document = " ".join(f"fact {i} is {i * i}." for i in range(40))
    first = client.responses.create(model=MODEL, input=document, max_output_tokens=4)
    assert first.status in ("completed", "incomplete") and first.output_text
    events = list(
        client.responses.create(
            model=MODEL,
            input="And fact 3?",
            previous_response_id=first.id,
            max_output_tokens=4,
            stream=True,
        )
    )
    final = events[-1].response
    assert events[0].type == "response.created"
    assert final.usage.input_tokens > first.usage.input_tokens
    assert final.usage.input_tokens_details.cached_tokens > 0
