"""A success the client saw is billed even when its gateway replica dies right after:
the usage row is in Postgres before the answer's end leaves the gateway. (Found by
``kvgate bench faults``: a replica killed with SIGKILL lost the rows of its last flush
interval.) The replica here flushes its buffer every second (the most the settings
allow), and is killed within milliseconds of the answer's end."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from tests.support.gateway import (
    deregister,
    gateway_process,
    poll,
    register_workers,
    stub_upstream,
    team_key,
    unique,
)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_success_is_billed_though_its_replica_is_killed_right_after(
    pg_dsn: str, pg_pool: asyncpg.Pool, stream: bool
) -> None:
    _, key = await team_key(pg_pool)
    model, worker = unique("m-durable"), unique("w-durable")
    with (
        stub_upstream(worker) as (stub_url, _),
        gateway_process(pg_dsn, KVGATE_GATEWAY_USAGE_FLUSH_S="1") as (url, gateway),
    ):
        await register_workers(pg_pool, model, {worker: stub_url})
        poll(lambda: model in httpx.get(url + "/v1/models").text, what="the worker is seen")
        body = {
            "model": model,
            "max_tokens": 3,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=30
        ) as response:
            assert response.status_code == 200
            text = response.read().decode()
            request_id = response.headers["x-request-id"]
        assert "[DONE]" in text if stream else '"usage"' in text
        gateway.kill()  # SIGKILL: nothing buffered in the replica survives
        gateway.wait()
    row = await pg_pool.fetchrow(
        "SELECT status, completion_tokens FROM usage WHERE request_id = $1", request_id
    )
    assert row is not None, "the usage row of a success the client saw was lost"
    assert (row["status"], row["completion_tokens"]) == (200, 3)
    await deregister(pg_pool, [worker])
