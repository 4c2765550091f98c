"""The gateway end to end over HTTP: a real gateway process, Postgres, and a stub upstream.

The upstream here is ``kvgate.bench.stub_upstream`` (an OpenAI-shaped stand-in, not a model);
the test with the official client against built-in workers is test_gateway_openai.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import httpx
import openai
import orjson
import pytest

from gateway import accounts
from protocol.fields import CACHE_SALT_FIELDS
from tests.support.gateway import (
    StubRig as Rig,
)
from tests.support.gateway import (
    apoll,
    poll,
    stub_rig,
    team_key,
    unique,
)


@pytest.fixture(scope="module")
async def rig(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[Rig]:
    async with stub_rig(pg_dsn, pg_pool, "app") as made:
        yield made


def _ip() -> str:
    return f"198.51.100.{unique('x').__hash__() % 250 + 1}"


def _chat(rig: Rig, **kw: object) -> dict[str, object]:
    return {"model": rig.model, "messages": [{"role": "user", "content": "hi"}], **kw}


def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_service_endpoints_carry_request_ids(rig: Rig) -> None:
    ids = set()
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/models"):
        response = httpx.get(rig.url + path)
        assert response.status_code == 200, (path, response.text)
        ids.add(response.headers["x-request-id"])
    assert len(ids) == 5
    doc = httpx.get(rig.url + "/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(doc["paths"])
    models = httpx.get(rig.url + "/v1/models").json()
    assert rig.model in [m["id"] for m in models["data"]]
    assert "kvgate_gateway_requests_total" in httpx.get(rig.url + "/metrics").text


def test_no_key_or_a_placeholder_is_the_free_tier_and_bad_keys_are_401(
    rig: Rig, pg_dsn: str
) -> None:
    """OpenAI's SDK will not run without an api_key, so the placeholders OpenAI-compatible
    servers accept (EMPTY, sk-no-key-required, any non-kvgate token) are the free tier; a
    kvgate key must be live, on every /v1 route."""
    for headers in ({}, {"authorization": "Bearer EMPTY"}, {"authorization": "Bearer sk-x"}):
        free = httpx.post(rig.url + "/v1/chat/completions", json=_chat(rig), headers=headers)
        assert free.status_code == 200, free.text
        assert free.headers["x-ratelimit-limit-requests"] == "10"  # the free plan
    for header in ("Basic abc", "Bearer kvg_short", "Bearer kvg_" + "A" * 43):
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            response = httpx.request(
                method, rig.url + path, json=_chat(rig), headers={"authorization": header}
            )
            assert response.status_code == 401, (header, path, response.text)
            assert _error(response)["type"] == "authentication_error"
            assert "x-request-id" in response.headers


def test_models_one_by_one_and_unknown_routes_answer_in_openais_shape(rig: Rig) -> None:
    one = httpx.get(f"{rig.url}/v1/models/{rig.model}")
    assert one.status_code == 200 and one.json()["id"] == rig.model
    assert one.json()["object"] == "model"
    missing = httpx.get(rig.url + "/v1/models/no-such-model")
    assert missing.status_code == 404 and _error(missing)["code"] == "model_not_found"
    unknown = httpx.get(rig.url + "/v1/no-such-route")
    assert unknown.status_code == 404 and "/v1/no-such-route" in _error(unknown)["message"]
    wrong = httpx.get(rig.url + "/v1/chat/completions")
    assert wrong.status_code == 405 and _error(wrong)["message"]


async def test_revoked_key_is_refused(rig: Rig, pg_pool: asyncpg.Pool) -> None:
    team_id, key = await team_key(pg_pool)
    auth = {"authorization": f"Bearer {key}"}
    assert httpx.post(rig.url + "/v1/chat/completions", json=_chat(rig), headers=auth).is_success
    key_id = await pg_pool.fetchval("SELECT max(id) FROM api_keys WHERE team_id = $1", team_id)
    await accounts.revoke_key(pg_pool, key_id)
    poll(
        lambda: (
            httpx.post(rig.url + "/v1/chat/completions", json=_chat(rig), headers=auth).status_code
            == 401
        ),
        deadline_s=5,
        what="revoked key refused",
    )


def test_validation_errors_are_openai_shaped(rig: Rig) -> None:
    auth = {"authorization": f"Bearer {rig.key}"}
    cases = [
        (b"{not json", 400, None),
        (orjson.dumps({"messages": []}), 400, "model"),
        (orjson.dumps({"model": rig.model, "messages": "hi"}), 400, "messages"),
        (orjson.dumps(_chat(rig, max_tokens=100_000)), 400, "max_tokens"),
        (orjson.dumps(_chat(rig, stream="yes")), 400, "stream"),
        (orjson.dumps({**_chat(rig), "model": "no-such-model"}), 404, "model"),
        (orjson.dumps(_chat(rig, padding="x" * 30_000)), 413, None),
    ]
    for raw, status, param in cases:
        response = httpx.post(
            rig.url + "/v1/chat/completions",
            content=raw,
            headers={**auth, "content-type": "application/json"},
        )
        assert response.status_code == status, (raw[:40], response.text)
        assert _error(response)["param"] == param


def test_openai_client_chat_and_completions_through_the_gateway(rig: Rig) -> None:
    client = openai.OpenAI(base_url=rig.url + "/v1", api_key=rig.key, max_retries=0)
    chat = client.chat.completions.create(
        model=rig.model, messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    assert chat.choices[0].message.content == "xxx" and chat.usage.completion_tokens == 3
    text = client.completions.create(model=rig.model, prompt="hello", max_tokens=2)
    assert text.choices[0].text == "xx"

    chunks = list(
        client.chat.completions.create(
            model=rig.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "xxxx"
    assert all(c.usage is None for c in chunks)  # not asked for: the usage chunk is dropped

    chunks = list(
        client.completions.create(
            model=rig.model,
            prompt="hi",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_team_salt_overwrites_client_salt_and_extras_pass(
    rig: Rig, pg_pool: asyncpg.Pool
) -> None:
    salt = await pg_pool.fetchval("SELECT cache_salt FROM teams WHERE id = $1", rig.team_id)
    extras = {"min_tokens": 2, "seed": 7, "top_k": 5, "stop_token_ids": [3], "ignore_eos": True}
    body = _chat(rig, max_tokens=2, stream=True, extra_key="evil", cache_salt="evil", **extras)
    response = httpx.post(
        rig.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {rig.key}", "x-session-id": unique("salt")},
    )
    assert response.status_code == 200
    assert response.text.endswith("data: [DONE]\n\n")
    seen = httpx.get(rig.upstream + "/control/requests").json()
    sent = next(b for b in reversed(seen) if b.get("seed") == 7)
    assert all(sent[f] == salt for f in CACHE_SALT_FIELDS)
    assert {k: sent[k] for k in extras} == extras
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_every_request_leaves_one_usage_row(rig: Rig, pg_pool: asyncpg.Pool) -> None:
    team_id, key = await team_key(pg_pool)
    ids = []
    for stream in (False, True):
        response = httpx.post(
            rig.url + "/v1/chat/completions",
            json=_chat(rig, max_tokens=5, stream=stream),
            headers={"authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200
        ids.append(response.headers["x-request-id"])

    found = await apoll(
        lambda: pg_pool.fetch("SELECT * FROM usage WHERE request_id = any($1::text[])", ids),
        lambda rows: len(rows) == 2,
        what="two usage rows",
    )
    assert len(found) == 2
    assert all(
        r["team_id"] == team_id and r["completion_tokens"] == 5 and r["status"] == 200
        for r in found
    )
    daily = await pg_pool.fetchrow(
        "SELECT requests, completion_tokens FROM usage_daily WHERE team_id = $1", team_id
    )
    assert tuple(daily) == (2, 10)
    # The daily quota was charged the reservation at admission and settled to the truth.
    spent = await pg_pool.fetchval(
        "SELECT used FROM rate_daily WHERE subject = $1", f"team:{team_id}"
    )
    assert spent == sum(r["prompt_tokens"] + r["completion_tokens"] for r in found)


async def test_a_body_nested_too_deep_is_a_400_that_holds_no_lease(
    rig: Rig, pg_pool: asyncpg.Pool
) -> None:
    """Bodies nested hundreds of levels once passed admission, then failed to re-serialise:
    a 500 whose concurrency lease lived 11 minutes. Two filled a plan's concurrency."""
    _, key = await team_key(pg_pool, max_concurrent=1)
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    for depth in (300, 300, 1200):
        raw = _deep_json(rig, depth)
        response = httpx.post(rig.url + "/v1/chat/completions", content=raw, headers=auth)
        assert response.status_code == 400, response.text
        assert re.search("nests deeper|depth limit", _error(response)["message"])
    ok = httpx.post(rig.url + "/v1/chat/completions", json=_chat(rig), headers=auth)
    assert ok.status_code == 200, ok.text  # the plan's one slot is free


def _deep_json(rig: Rig, depth: int) -> bytes:
    """A chat body with ``depth`` nested arrays, written by hand (encoders refuse it)."""
    head = orjson.dumps(_chat(rig))[:-1]
    return head + b',"metadata":' + b"[" * depth + b'"deep"' + b"]" * depth + b"}"
