"""Two gateway processes sharing one Postgres: limits are exact, revocations spread fast.

The upstream is a ``kvgate.bench.stub_upstream`` process (OpenAI-shaped stand-in, not a model).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest

from gateway import accounts
from tests.support.gateway import (
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    team_key,
    unique,
)

N = 6


@dataclass
class Pair:
    a: str
    b: str
    model: str

    def body(self, **kw: object) -> dict[str, object]:
        return {"model": self.model, "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.fixture(scope="module")
async def pair(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[Pair]:
    model, worker = unique("m-pair"), unique("w-pair")
    with contextlib.ExitStack() as stack:
        upstream, _ = stack.enter_context(stub_upstream(worker))
        await register_workers(pg_pool, model, {worker: upstream}, capacity=64)
        a, _ = stack.enter_context(gateway_process(pg_dsn))
        b, _ = stack.enter_context(gateway_process(pg_dsn))
        yield Pair(a, b, model)
    await deregister(pg_pool, [worker])


def _post(url: str, body: dict[str, object], **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


async def test_requests_per_minute_exact_across_replicas(pair: Pair, pg_pool: asyncpg.Pool) -> None:
    _, key = await team_key(pg_pool, requests_per_min=N)
    auth = {"authorization": f"Bearer {key}"}
    remaining = []
    for i in range(N):
        response = _post(pair.a if i % 2 else pair.b, pair.body(max_tokens=1), **auth)
        assert response.status_code == 200, response.text
        remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
    assert remaining == list(range(N - 1, -1, -1))
    refused = _post(pair.a, pair.body(max_tokens=1), **auth)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error"
    h = refused.headers
    assert h["x-ratelimit-limit-requests"] == str(N)
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    assert int(h["retry-after"]) >= 1
    assert {"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"} <= set(h)
    assert "x-should-retry" not in h


async def test_concurrent_burst_on_both_replicas_admits_exactly_n(
    pair: Pair, pg_pool: asyncpg.Pool
) -> None:
    _, key = await team_key(pg_pool, requests_per_min=N)
    auth = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    (pair.a, pair.b)[i % 2] + "/v1/chat/completions",
                    json=pair.body(max_tokens=1),
                    headers=auth,
                )
                for i in range(3 * N)
            )
        )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * N + [429] * (2 * N)


async def test_daily_quota_spent_says_do_not_retry(pair: Pair, pg_pool: asyncpg.Pool) -> None:
    _, key = await team_key(pg_pool, tokens_per_day=100)
    auth = {"authorization": f"Bearer {key}"}
    assert _post(pair.a, pair.body(max_tokens=60), **auth).status_code == 200
    refused = _post(pair.b, pair.body(max_tokens=60), **auth)
    assert refused.status_code == 429
    assert refused.headers["x-should-retry"] == "false"
    assert refused.json()["error"]["code"] == "tokens_per_day"


async def test_free_tier_is_limited_per_client_ip(pair: Pair) -> None:
    # Fresh addresses: rate state outlives a test run when DATABASE_URL is a shared server.
    ip, other = (f"198.18.{random.randrange(256)}.{random.randrange(1, 255)}" for _ in "ab")
    codes = [
        _post((pair.a, pair.b)[i % 2], pair.body(max_tokens=1), **{"x-forwarded-for": ip})
        for i in range(11)
    ]
    assert [r.status_code for r in codes] == [200] * 10 + [429]
    assert "Use an API key" in codes[-1].json()["error"]["message"]
    assert _post(pair.a, pair.body(max_tokens=1), **{"x-forwarded-for": other}).is_success


async def test_revoked_on_one_replica_fails_on_the_other_within_5s(
    pair: Pair, pg_pool: asyncpg.Pool
) -> None:
    team_id, key = await team_key(pg_pool)
    auth = {"authorization": f"Bearer {key}"}
    assert _post(pair.a, pair.body(max_tokens=1), **auth).is_success
    assert _post(pair.b, pair.body(max_tokens=1), **auth).is_success  # both caches warm
    key_id = await pg_pool.fetchval("SELECT max(id) FROM api_keys WHERE team_id = $1", team_id)
    await accounts.revoke_key(pg_pool, key_id)
    revoked_at = time.monotonic()
    refused: set[str] = set()
    while len(refused) < 2 and time.monotonic() - revoked_at < 5:
        for url in (pair.a, pair.b):
            if _post(url, pair.body(max_tokens=1), **auth).status_code == 401:
                refused.add(url)
        await asyncio.sleep(0.1)  # polling interval, not synchronisation
    assert refused == {pair.a, pair.b}
