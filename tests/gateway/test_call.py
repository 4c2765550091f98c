"""Whatever fails after admission, the request's lease is released and its usage row written.

In process, on the real Postgres: a bug is planted in the proxying step (``Call.forward``
raising), which no client input can reach any more, to show that the pipeline itself
settles every admitted request.
"""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from gateway.app import build_app
from gateway.call import Call
from gateway.config import GatewayConfig
from tests.support.gateway import deregister, register_workers, team_key, unique


async def test_a_bug_after_admission_still_releases_the_lease_and_meters_the_request(
    pg_dsn: str, pg_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: Call, *args: object) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(Call, "forward", broken)
    model, worker = unique("m-bug"), unique("w-bug")
    await register_workers(pg_pool, model, {worker: "http://127.0.0.1:9"})
    team_id, key = await team_key(pg_pool, max_concurrent=1)
    app = build_app(GatewayConfig(dsn=pg_dsn))
    gw = app.state.gateway
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        async with gw.lifespan(app):
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                for _ in range(2):  # the second is admitted too: the first left its slot
                    reply = await client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {key}"},
                    )
                    assert reply.status_code == 500, reply.text
                    assert reply.json()["error"]["type"] == "server_error"
                    await gw.limiter.flush_releases()  # what its release loop does next
            await gw.usage.flush()
    finally:
        await deregister(pg_pool, [worker])
    leases = await pg_pool.fetchval(
        "SELECT count(*) FROM inflight WHERE subject = $1", f"team:{team_id}"
    )
    statuses = await pg_pool.fetch("SELECT status FROM usage WHERE team_id = $1", team_id)
    assert leases == 0
    assert [r["status"] for r in statuses] == [500, 500]
