"""The playground's calls through a real gateway to a real tiered worker: a visitor's move
to cold storage sends its own conversation to the NAS (its next turn comes back from
there) and leaves another visitor's on the device; a team key moves its team's, not its
address's; a body naming a namespace, or anything
else malformed, is a 400; the per-caller limit answers 429; the prefill rate the worker
measured is reported per model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.gateway import team_key
from tests.support.playground import playground_stack
from tests.support.site import fresh_ip
from tests.support.worker import MODEL

LIMIT = 3
CHAT = [{"role": "user", "content": "Tell me about lighthouses and their keepers. " * 4}]


@pytest.fixture(scope="module")
async def gateway(
    pg_dsn: str, pg_pool: asyncpg.Pool, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    nas = tmp_path_factory.mktemp("playground-nas")
    async with (
        playground_stack(pg_dsn, pg_pool, nas, smollm2_gguf, cold_storage_limit=LIMIT) as url,
        httpx.AsyncClient(base_url=url, timeout=120) as client,
    ):
        yield client


async def _turn(client: httpx.AsyncClient, ip: str, **headers: str) -> dict[str, int]:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0}
    headers["x-forwarded-for"] = ip
    reply = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]


async def _move(client: httpx.AsyncClient, ip: str, body: Any, **headers: str) -> httpx.Response:
    headers["x-forwarded-for"] = ip
    return await client.post("/playground/cold-storage", json=body, headers=headers)


async def test_a_visitor_moves_only_its_own_conversation_to_the_nas(
    gateway: httpx.AsyncClient,
) -> None:
    me, other = fresh_ip(), fresh_ip()
    await _turn(gateway, me)
    await _turn(gateway, other)  # the same prompt, in the other visitor's namespace

    moved = await _move(gateway, me, {"tier": "nas"})
    assert moved.status_code == 200, moved.text
    counts = moved.json()
    assert counts["tier"] == "nas" and counts["workers"] >= 1
    assert counts["device_pages"] > 0 and counts["pages"] >= counts["device_pages"]

    mine = await _turn(gateway, me)
    assert mine["nas"] > 0 and mine["device"] == 0 and mine["host"] == 0
    theirs = await _turn(gateway, other)
    assert theirs["device"] > 0 and theirs["nas"] == 0

    # a caller without pages anywhere moves nothing, and nobody else's
    nothing = await _move(gateway, fresh_ip(), {"tier": "nas"})
    assert nothing.status_code == 200
    assert nothing.json()["pages"] == 0


async def test_a_team_key_moves_its_teams_conversation_not_its_addresss(
    gateway: httpx.AsyncClient, pg_pool: asyncpg.Pool
) -> None:
    _, secret = await team_key(pg_pool)
    ip = fresh_ip()
    await _turn(gateway, ip, authorization=f"Bearer {secret}")
    await _turn(gateway, ip)  # the same address without the key: the free tier's namespace

    moved = await _move(gateway, ip, {"tier": "nas"}, authorization=f"Bearer {secret}")
    assert moved.status_code == 200, moved.text
    assert moved.json()["device_pages"] > 0

    assert (await _turn(gateway, ip, authorization=f"Bearer {secret}"))["nas"] > 0
    assert (await _turn(gateway, ip))["device"] > 0
    refused = await _move(gateway, ip, {"tier": "nas"}, authorization="Bearer kvg_not-a-key")
    assert refused.status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tier": "nas", "cache_salt": "someone-else"}, "cache_salt"),
        ({"tier": "tape"}, "tier"),
        ({}, "tier"),
        ([], None),
    ],
)
async def test_a_bad_body_is_a_400(
    gateway: httpx.AsyncClient, body: Any, param: str | None
) -> None:
    reply = await _move(gateway, fresh_ip(), body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


async def test_a_body_not_sent_as_json_is_refused(gateway: httpx.AsyncClient) -> None:
    headers = {"x-forwarded-for": fresh_ip()}
    form = await gateway.post("/playground/cold-storage", data={"tier": "nas"}, headers=headers)
    assert form.status_code == 415
    assert "application/json" in form.json()["error"]["message"]
    broken = await gateway.post(
        "/playground/cold-storage",
        content=b'{"tier": ',
        headers={**headers, "content-type": "application/json"},
    )
    assert broken.status_code == 400
    assert "not valid JSON" in broken.json()["error"]["message"]


async def test_each_caller_may_move_its_pages_a_few_times_per_window(
    gateway: httpx.AsyncClient,
) -> None:
    ip = fresh_ip()
    for _ in range(LIMIT):
        assert (await _move(gateway, ip, {"tier": "nas"})).status_code == 200
    refused = await _move(gateway, ip, {"tier": "nas"})
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0
    assert f"At most {LIMIT}" in refused.json()["error"]["message"]
    # another caller has a count of its own
    assert (await _move(gateway, fresh_ip(), {"tier": "nas"})).status_code == 200


async def test_the_prefill_rate_the_worker_measured_is_reported(
    gateway: httpx.AsyncClient,
) -> None:
    await _turn(gateway, fresh_ip())
    reply = await gateway.get("/playground/prefill", params={"model": MODEL})
    assert reply.status_code == 200, reply.text
    assert reply.json()["prefill_tokens_per_s"] > 0
    assert (await gateway.get("/playground/prefill")).status_code == 400
    missing = await gateway.get("/playground/prefill", params={"model": "no-such-model"})
    assert missing.status_code == 404
