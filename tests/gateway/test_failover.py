"""Upstream failures: a dead worker before the first byte, a worker killed mid-stream, and
a client hanging up. Upstreams are ``kvgate.bench.stub_upstream`` processes (not models)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from kvgate.stack.ports import free_port
from tests.support.gateway import (
    apoll,
    deregister,
    gateway_process,
    poll,
    register_workers,
    stub_upstream,
    team_key,
    unique,
)


@pytest.fixture(scope="module")
async def gw(pg_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[tuple[str, str]]:
    _, key = await team_key(pg_pool)
    with gateway_process(pg_dsn) as (url, _):
        yield url, key


async def _ready(url: str, model: str) -> None:
    poll(
        lambda: model in httpx.get(url + "/v1/models").text,
        what=f"gateway sees workers of {model}",
    )


async def test_dead_worker_before_first_byte_is_skipped(
    gw: tuple[str, str], pg_pool: asyncpg.Pool
) -> None:
    url, key = gw
    model = unique("m-dead")
    dead, live = unique("w-dead"), unique("w-live")
    with stub_upstream(live) as (live_url, _):
        await register_workers(
            pg_pool, model, {dead: f"http://127.0.0.1:{free_port()}", live: live_url}
        )
        await _ready(url, model)
        for i in range(8):
            response = httpx.post(
                url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {key}", "x-session-id": f"s{i}"},
                json={
                    "model": model,
                    "max_tokens": 2,
                    "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            assert response.status_code == 200, response.text
        metrics = httpx.get(url + "/metrics").text
        assert f'kvgate_gateway_upstream_errors_total{{kind="connect",worker="{dead}"}}' in metrics
    await deregister(pg_pool, [dead, live])


async def test_worker_killed_mid_stream_ends_with_error_and_done(
    gw: tuple[str, str], pg_pool: asyncpg.Pool
) -> None:
    url, key = gw
    model, worker = unique("m-kill"), unique("w-kill")
    with stub_upstream(worker, "--hang-after", "2") as (stub_url, proc):
        await register_workers(pg_pool, model, {worker: stub_url})
        await _ready(url, model)
        body = {
            "model": model,
            "max_tokens": 10,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=15,
        ) as response:
            assert response.status_code == 200
            events = []
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 2:
                    proc.kill()
                    break
            events += [line for line in lines if line.startswith("data: ")]
    assert '"delta"' in events[0] and '"delta"' in events[1]
    assert '"error"' in events[-2] and "upstream_error" in events[-2]
    assert events[-1] == "data: [DONE]"
    await deregister(pg_pool, [worker])


async def test_client_hangup_aborts_the_upstream_request(
    gw: tuple[str, str], pg_pool: asyncpg.Pool
) -> None:
    url, key = gw
    model, worker = unique("m-hangup"), unique("w-hangup")
    with stub_upstream(worker, "--hang-after", "1") as (stub_url, _):
        await register_workers(pg_pool, model, {worker: stub_url})
        await _ready(url, model)
        body = {"model": model, "max_tokens": 10, "stream": True, "prompt": "hi"}
        with httpx.stream(
            "POST",
            url + "/v1/completions",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=15,
        ) as response:
            lines = response.iter_lines()  # kept referenced: dropping it hangs up
            assert '"text"' in next(lines)

            def streams() -> int:
                return httpx.get(stub_url + "/control/stats").json()["streaming"]

            assert streams() == 1
            request_id = response.headers["x-request-id"]
            response.close()
        poll(lambda: streams() == 0, what="upstream stream closed after the client left")
    # The token the client got is metered, prompt included: hanging up is not free.
    row = await apoll(
        lambda: pg_pool.fetchrow("SELECT * FROM usage WHERE request_id = $1", request_id),
        lambda r: r is not None,
        what="the hung-up request's usage row",
    )
    assert row["status"] == 499 and row["completion_tokens"] == 1 and row["prompt_tokens"] > 0
    await deregister(pg_pool, [worker])


async def test_a_non_streamed_client_that_leaves_ends_its_upstream_request(
    gw: tuple[str, str], pg_pool: asyncpg.Pool
) -> None:
    """The worker stops waiting (generating, for a real one) as soon as the client leaves,
    and the usage row says 499."""
    url, key = gw
    model, worker = unique("m-leave"), unique("w-leave")
    with stub_upstream(worker, "--hold") as (stub_url, _):
        await register_workers(pg_pool, model, {worker: stub_url})
        await _ready(url, model)

        body = {"model": model, "max_tokens": 10, "prompt": "hi", "user": unique("u")}
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=30) as client:

            async def inflight() -> int:
                return (await client.get(stub_url + "/control/stats")).json()["inflight"]

            call = asyncio.create_task(
                client.post(url + "/v1/completions", json=body, headers=headers)
            )
            await apoll(inflight, lambda n: n == 1, what="the request held at the worker")
            call.cancel()  # the client gives up: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await call
            await apoll(inflight, lambda n: n == 0, what="the worker's request ended")
    row = await apoll(
        lambda: pg_pool.fetchrow("SELECT status FROM usage WHERE model = $1", model),
        lambda r: r is not None,
        what="the usage row",
    )
    assert row["status"] == 499
    await deregister(pg_pool, [worker])
