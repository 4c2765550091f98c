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
        # Other tests share the loopback subject; start it from a full bucket so the count
        # below does not depend on how much of their use has drained meanwhile.
        for table in ("rate_state", "rate_daily"):
            await pg_pool.execute(f"DELETE FROM {table} WHERE subject = 'ip:127.0.0.1'")
        per_min = await pg_pool.fetchval("SELECT requests_per_min FROM plans WHERE name = 'free'")
        with gateway_process(pg_dsn, KVGATE_GATEWAY_TRUSTED_PROXIES="[]") as (url, _):
            remaining = []
            for fake in ("203.0.113.1", "203.0.113.2"):
                response = httpx.post(
                    url + "/v1/completions",
                    json={"model": model, "prompt": "hi", "max_tokens": 1},
                    headers={"x-forwarded-for": fake},
                )
                assert response.status_code == 200, response.text
                remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
        await deregister(pg_pool, [worker])
    # One subject (the real peer, 127.0.0.1), not one per claimed address.
    assert remaining == [per_min - 1, per_min - 2]
    claimed = await pg_pool.fetchval(
        "SELECT count(*) FROM rate_state WHERE subject LIKE 'ip:203.0.113.%'"
    )
    assert claimed == 0
    rows = await pg_pool.fetch(
        "SELECT DISTINCT host(client_ip) AS ip FROM usage WHERE model = $1", model
    )
    assert [r["ip"] for r in rows] == ["127.0.0.1"]
