"""X-Forwarded-For is believed only from configured proxies (here: none are configured).

The upstream is a ``kvgate.bench.stub_upstream`` process (OpenAI-shaped stand-in, not a model).
"""

from __future__ import annotations

import asyncpg
import httpx

from tests.support.gateway import (
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    unique,
)


async def test_forwarded_for_from_an_untrusted_peer_is_ignored(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    model, worker = unique("m-xff"), unique("w-xff")
    with stub_upstream(worker) as (upstream, _):
        await register_workers(pg_pool, model, {worker: upstream})
        with gateway_process(pg_dsn, KVGATE_GATEWAY_TRUSTED_PROXIES="[]") as (url, _):
            remaining = []
            for fake in ("203.0.113.1", "203.0.113.2"):
                response = httpx.post(
                    url + "/v1/completions",
                    json={"model": model, "prompt": "hi", "max_tokens": 1},
                    headers={"x-forwarded-for": fake},
                )
                assert response.status_code in (200, 429), response.text
                remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
        await deregister(pg_pool, [worker])
    # One subject (the real peer, 127.0.0.1), not one per claimed address.
    assert remaining[1] == max(remaining[0] - 1, 0)
    rows = await pg_pool.fetch(
        "SELECT DISTINCT host(client_ip) AS ip FROM usage WHERE model = $1", model
    )
    assert [r["ip"] for r in rows] == ["127.0.0.1"]
