"""``/v1/responses`` end to end: the official SDK against a real gateway process, Postgres,
and a stub upstream (``kvgate.bench.stub_upstream``: OpenAI-shaped, one ``x`` per token,
every answer cut by its length cap, so every response here is ``incomplete``).

What the stub received shows the chat completion each response became; the SDK's own
types check every object and event the gateway sends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from kvgate.stack.ports import free_port
from tests.support.gateway import (
    StubRig as Rig,
)
from tests.support.gateway import (
    apoll,
    deregister,
    free_tier_address,
    register_workers,
    stub_rig,
    stub_upstream,
    team_key,
    unique,
)

EVENTS = TypeAdapter(ResponseStreamEvent)
#: OpenAI's event sequence for one text message (three tokens)
SEQUENCE = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",  # the stub always stops at the cap
]


@pytest.fixture(scope="module")
async def rig(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[Rig]:
    async with stub_rig(pg_dsn, pg_pool, "resp") as made:
        yield made


def _client(rig: Rig, key: str, ip: str | None = None) -> openai.OpenAI:
    headers = {"x-forwarded-for": ip or free_tier_address()}
    return openai.OpenAI(
        base_url=rig.url + "/v1", api_key=key, max_retries=0, default_headers=headers
    )


def _sent(rig: Rig, marker: str) -> dict[str, Any]:
    """The last chat body the stub received whose last message holds ``marker``."""
    bodies = httpx.get(rig.upstream + "/control/requests").json()
    return next(b for b in reversed(bodies) if marker in b["messages"][-1]["content"])


def _answered(rig: Rig, endpoint: str) -> float:
    """How many answers with status 200 the gateway counts under ``endpoint``."""
    text = httpx.get(rig.url + "/metrics").text
    prefix = f'kvgate_gateway_requests_total{{endpoint="{endpoint}",plan="free",status="200"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_created_response_is_counted_under_its_own_route(rig: Rig) -> None:
    before = _answered(rig, "/v1/responses"), _answered(rig, "/v1/chat/completions")
    _client(rig, "EMPTY").responses.create(model=rig.model, input="hi", max_output_tokens=1)
    after = _answered(rig, "/v1/responses"), _answered(rig, "/v1/chat/completions")
    assert after == (before[0] + 1, before[1])


@pytest.mark.parametrize("who", ["free tier", "team"])
def test_sdk_creates_a_response_whole_and_streamed(rig: Rig, who: str) -> None:
    client = _client(rig, "EMPTY" if who == "free tier" else rig.key)
    marker = unique("hello")
    response = client.responses.create(
        model=rig.model,
        input=marker,
        instructions="Answer briefly.",
        max_output_tokens=3,
        temperature=0.5,
        metadata={"case": who},
    )
    Response.model_validate(response.model_dump())
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == "xxx" and response.output[0].role == "assistant"
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.usage.input_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.store and response.metadata == {"case": who}
    sent = _sent(rig, marker)
    assert sent["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": marker},
    ]
    assert sent["max_tokens"] == 3 and sent["temperature"] == 0.5
    assert client.responses.retrieve(response.id).output_text == "xxx"

    events = list(
        client.responses.create(model=rig.model, input=marker, max_output_tokens=3, stream=True)
    )
    for event in events:
        EVENTS.validate_python(event.model_dump())
    assert [e.type for e in events] == SEQUENCE
    assert [e.sequence_number for e in events] == list(range(len(SEQUENCE)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "xxx"
    final = events[-1].response
    assert final.output_text == "xxx" and final.usage.output_tokens == 3
    assert final.usage.input_tokens > 0
    assert client.responses.retrieve(final.id).usage.output_tokens == 3


def test_a_follow_up_sends_the_whole_conversation_upstream(rig: Rig) -> None:
    """Chained turns reach the worker as the messages a client resending its history would
    send: the same chat template renders the same tokens, onto the same KV pages."""
    client = _client(rig, rig.key)
    first, second, third = unique("first"), unique("second"), unique("third")
    one = client.responses.create(
        model=rig.model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": first}]}],
        instructions="Be terse.",
        max_output_tokens=2,
    )
    two = client.responses.create(
        model=rig.model,
        input=second,
        previous_response_id=one.id,
        instructions="Be terse.",
        max_output_tokens=3,
    )
    assert two.previous_response_id == one.id
    history = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": first},
        {"role": "assistant", "content": "xx"},
        {"role": "user", "content": second},
    ]
    assert _sent(rig, second)["messages"] == history
    # A third turn, streamed, with other instructions: they do not carry over, the turns do.
    events = list(
        client.responses.create(
            model=rig.model,
            input=third,
            previous_response_id=two.id,
            instructions="Be kind.",
            max_output_tokens=1,
            stream=True,
        )
    )
    assert events[-1].type == "response.incomplete"
    assert _sent(rig, third)["messages"] == [
        {"role": "system", "content": "Be kind."},
        *history[1:],
        {"role": "assistant", "content": "xxx"},
        {"role": "user", "content": third},
    ]
    # A deleted response can no longer be read or continued.
    raw = httpx.delete(
        f"{rig.url}/v1/responses/{two.id}", headers={"authorization": f"Bearer {rig.key}"}
    )
    assert raw.json() == {"id": two.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(two.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model=rig.model, input="again", previous_response_id=two.id)
    assert gone.value.body["param"] == "previous_response_id"
    # Nor a later one whose conversation runs through it: its history is incomplete.
    with pytest.raises(openai.NotFoundError) as broken:
        client.responses.create(
            model=rig.model, input="again", previous_response_id=events[-1].response.id
        )
    assert "no longer stored" in broken.value.body["message"]


def test_text_format_and_the_routing_hint_reach_the_chat_completion(rig: Rig) -> None:
    marker = unique("json")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response = _client(rig, rig.key).responses.create(
        model=rig.model,
        input=marker,
        max_output_tokens=1,
        top_p=0.5,
        prompt_cache_key="conversation-7",
        text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}},
    )
    assert response.text.format.type == "json_schema" and response.top_p == 0.5
    sent = _sent(rig, marker)
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert sent["user"] == "conversation-7" and sent["top_p"] == 0.5


async def test_expired_responses_are_gone_and_swept_by_later_inserts(
    rig: Rig, pg_pool: asyncpg.Pool
) -> None:
    client = _client(rig, rig.key)
    old = client.responses.create(model=rig.model, input="old", max_output_tokens=1)
    kept_for = await pg_pool.fetchval(
        "SELECT expires_at - created_at FROM responses WHERE id = $1", old.id
    )
    assert kept_for.days == 30  # a team's retention
    await pg_pool.execute(
        "UPDATE responses SET expires_at = now() - interval '1 second' WHERE id = $1", old.id
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(old.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=rig.model, input="x", previous_response_id=old.id)
    assert await pg_pool.fetchval("SELECT count(*) FROM responses WHERE id = $1", old.id) == 1
    client.responses.create(model=rig.model, input="new", max_output_tokens=1)
    assert await pg_pool.fetchval("SELECT count(*) FROM responses WHERE id = $1", old.id) == 0
    free = _client(rig, "EMPTY").responses.create(model=rig.model, input="hi", max_output_tokens=1)
    kept_for = await pg_pool.fetchval(
        "SELECT expires_at - created_at FROM responses WHERE id = $1", free.id
    )
    assert kept_for.days == 1  # the free tier's


def test_store_false_is_answered_but_not_kept(rig: Rig) -> None:
    client = _client(rig, rig.key)
    response = client.responses.create(
        model=rig.model, input="hi", max_output_tokens=1, store=False
    )
    assert response.output_text == "x" and response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


async def test_another_tenants_response_is_not_found(rig: Rig, pg_pool: asyncpg.Pool) -> None:
    """Another team, and another free-tier client, meet 404: existence is not revealed."""
    _, other_key = await team_key(pg_pool)
    owner_ip = free_tier_address()
    team_response = _client(rig, rig.key).responses.create(
        model=rig.model, input="mine", max_output_tokens=1
    )
    free_response = _client(rig, "EMPTY", owner_ip).responses.create(
        model=rig.model, input="mine too", max_output_tokens=1
    )
    strangers = [_client(rig, other_key), _client(rig, "EMPTY", free_tier_address())]
    for stranger in strangers:
        for response in (team_response, free_response):
            with pytest.raises(openai.NotFoundError):
                stranger.responses.retrieve(response.id)
            with pytest.raises(openai.NotFoundError):
                stranger.responses.delete(response.id)
            with pytest.raises(openai.NotFoundError):
                stranger.responses.create(
                    model=rig.model, input="x", previous_response_id=response.id
                )
    # The owners still have theirs, and nothing ran upstream for the strangers.
    assert _client(rig, rig.key).responses.retrieve(team_response.id).output_text == "x"
    free = _client(rig, "EMPTY", owner_ip).responses.retrieve(free_response.id)
    assert free.output_text == "x"
    owners = await pg_pool.fetch(
        "SELECT owner, team_id FROM responses WHERE id = any($1::text[]) ORDER BY team_id",
        [team_response.id, free_response.id],
    )
    assert [tuple(r) for r in owners] == [
        (f"team:{rig.team_id}", rig.team_id),
        (f"ip:{owner_ip}", None),
    ]


def test_requests_it_cannot_honour_are_400s_naming_the_field(rig: Rig) -> None:
    def body(**fields: Any) -> bytes:
        return orjson.dumps({"model": rig.model, "input": "hi", **fields})

    text = {"type": "message", "role": "user"}
    cases: list[tuple[bytes, str | None, str]] = [
        (b"{not json", None, "not valid JSON"),
        (b"[1]", None, "JSON object"),
        (orjson.dumps({"input": "hi"}), "model", "required"),
        (body(input=""), "input", "empty"),
        (body(input=[]), "input", "empty"),
        (
            body(input=[{**text, "content": [{"type": "input_image", "image_url": "x"}]}]),
            "input",
            "input_image",
        ),
        (
            body(input=[{"type": "function_call_output", "call_id": "c", "output": "o"}]),
            "input",
            "function_call_output",
        ),
        (body(input=[{"role": "robot", "content": "x"}]), "input", "robot"),
        (body(input=[{"role": "user", "content": [{"type": "input_text"}]}]), "input", "'text'"),
        (body(tools=[{"type": "function", "name": "f"}]), "tools", "tools"),
        (body(tool_choice="required"), "tool_choice", "tools"),
        (body(reasoning={"effort": "high"}), "reasoning", "reasoning"),
        (body(background=True), "background", "background"),
        (body(truncation="auto"), "truncation", "fit the context"),
        (body(stream="yes"), "stream", "boolean"),
        (body(store="no"), "store", "boolean"),
        (body(max_output_tokens=0), "max_output_tokens", "greater than"),
        (body(max_output_tokens=100_000), "max_output_tokens", "plan allows"),
        (body(metadata={str(i): "v" for i in range(17)}), "metadata", "16"),
        (body(text={"format": {"type": "json_schema"}}), "text.format", "schema"),
        (body(input="x" * 60_000), None, "larger than"),
    ]
    auth = {"authorization": f"Bearer {rig.key}", "content-type": "application/json"}
    for raw, param, words in cases:
        response = httpx.post(rig.url + "/v1/responses", content=raw, headers=auth)
        expected = 413 if words == "larger than" else 400
        assert response.status_code == expected, (raw[:80], response.text)
        error = response.json()["error"]
        assert error["param"] == param, (raw[:80], error)
        assert words.lower() in error["message"].lower(), (raw[:80], error)
    # Ids that name nothing: 404 in OpenAI's shape, whatever they look like.
    for bad in ("resp_" + "0" * 48, "nope", "%00", "resp_" + "f" * 300):
        found = httpx.get(f"{rig.url}/v1/responses/{bad}", headers=auth)
        assert found.status_code == 404, (bad, found.text)
        chained = httpx.post(
            rig.url + "/v1/responses", content=body(previous_response_id=bad), headers=auth
        )
        assert chained.status_code in (400, 404), (bad, chained.text)
        assert chained.json()["error"]["param"] == "previous_response_id"


@pytest.fixture
def dying_upstream() -> Iterator[tuple[str, Any]]:
    with stub_upstream(unique("w-dying"), "--hang-after", "2") as (url, proc):
        yield url, proc


async def test_an_upstream_failure_fails_the_response_and_frees_its_lease(
    rig: Rig, pg_pool: asyncpg.Pool, dying_upstream: tuple[str, Any]
) -> None:
    stub_url, proc = dying_upstream
    model, worker = unique("m-dying"), unique("w-dying")
    await register_workers(pg_pool, model, {worker: stub_url})
    team_id, key = await team_key(pg_pool, max_concurrent=1)
    auth = {"authorization": f"Bearer {key}"}
    await apoll(
        lambda: _get(rig.url + "/v1/models"),
        lambda text: model in text,
        what="the gateway sees the dying worker",
    )
    lines = []
    body = {"model": model, "input": "hi", "max_output_tokens": 10, "stream": True}
    with httpx.stream(
        "POST", rig.url + "/v1/responses", json=body, headers=auth, timeout=15
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if sum('"response.output_text.delta"' in x for x in lines) == 2 and line == "":
                proc.kill()  # after the second token's event
        request_id = response.headers["x-request-id"]
    events = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    for event in events:
        EVENTS.validate_python(event)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert events[-1]["response"]["store"] is False
    await deregister(pg_pool, [worker])

    row = await apoll(
        lambda: pg_pool.fetchrow("SELECT * FROM usage WHERE request_id = $1", request_id),
        lambda r: r is not None,
        what="the failed request's usage row",
    )
    assert row["status"] == 502 and row["team_id"] == team_id
    await apoll(
        lambda: pg_pool.fetchval(
            "SELECT count(*) FROM inflight WHERE subject = $1", f"team:{team_id}"
        ),
        lambda count: count == 0,
        what="the lease released",
    )
    assert await pg_pool.fetchval("SELECT count(*) FROM responses WHERE team_id = $1", team_id) == 0

    # A worker that cannot be reached: a 503, and the plan's one slot is free again after.
    dead_model, dead = unique("m-dead"), unique("w-dead")
    await register_workers(pg_pool, dead_model, {dead: f"http://127.0.0.1:{free_port()}"})
    await apoll(
        lambda: _get(rig.url + "/v1/models"),
        lambda text: dead_model in text,
        what="the gateway sees the dead worker",
    )
    for stream in (False, True):
        refused = httpx.post(
            rig.url + "/v1/responses",
            json={**body, "model": dead_model, "stream": stream},
            headers=auth,
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "no_worker_available"
    await deregister(pg_pool, [dead])


async def _get(url: str) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(url)).text
