"""The worker agent against the real registry (Postgres) and a real HTTP engine endpoint.

The engine here is ``SGLangLoadsReplay``: a small Starlette app on a real uvicorn server
that answers ``/v1/loads`` and ``/metrics`` in the exact shapes SGLang 0.5.23 produces
(SGLang itself needs a GPU, so it cannot run here). The agent with the built-in worker
and the gateway is in ``tests/e2e/test_agent_gateway.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from kvgate.stack.ports import free_port
from protocol import registry
from workers.agent import AgentConfig, WorkerAgent, load_from_loads_json, load_from_metrics_text

# What SGLang 0.5.23 prints on /metrics for these gauges (labels included).
SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"}} {running}
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"}} {queued}
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"}} 0.25
"""


@dataclass
class SGLangLoadsReplay:
    """Mutable load answered in SGLang's /v1/loads and /metrics formats."""

    running: int = 0
    queued: int = 0
    loads_endpoint: bool = True
    answering: bool = True  # False: a hung engine, every probe gets 503

    def app(self) -> Starlette:
        async def loads(request: Request) -> Response:
            if not self.answering:
                return PlainTextResponse("hung", status_code=503)
            if not self.loads_endpoint:
                return PlainTextResponse("Not Found", status_code=404)
            rank = {
                "dp_rank": 0,
                "num_running_reqs": self.running,
                "num_waiting_reqs": self.queued,
                "token_usage": 0.25,
            }
            return JSONResponse({"timestamp": "2026-01-01T00:00:00+00:00", "loads": [rank]})

        async def metrics(request: Request) -> Response:
            if not self.answering:
                return PlainTextResponse("hung", status_code=503)
            return PlainTextResponse(
                SGLANG_METRICS.format(running=self.running, queued=self.queued)
            )

        return Starlette(routes=[Route("/v1/loads", loads), Route("/metrics", metrics)])


@pytest.fixture
def engine() -> Iterator[tuple[SGLangLoadsReplay, str]]:
    replay = SGLangLoadsReplay()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(replay.app(), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test engine did not start"
        time.sleep(0.02)
    yield replay, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _config(url: str, **kw: object) -> AgentConfig:
    base = dict(
        worker_id=f"w-{uuid.uuid4().hex[:8]}",
        engine_url=url,
        advertise_url=None,
        model="m",
        capacity=8,
        heartbeat_interval_s=0.05,
        drain_quiet_s=0.3,
        drain_timeout_s=10.0,
    )
    return AgentConfig(**{**base, **kw})  # type: ignore[arg-type]


async def _row(pg_pool, worker_id: str) -> registry.WorkerInfo | None:
    rows = await registry.list_healthy(pg_pool, max_age_s=60)
    return next((r for r in rows if r.worker_id == worker_id), None)


def test_load_parsers_read_sglang_shapes() -> None:
    body = {"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 1}, {"num_running_reqs": 4}]}
    assert load_from_loads_json(body) == 7
    assert load_from_loads_json({"error": "nope"}) is None
    assert load_from_metrics_text(SGLANG_METRICS.format(running=3, queued=2)) == 5
    assert load_from_metrics_text("# nothing here\n") is None


async def test_registers_and_heartbeats_engine_load(pg_pool, engine) -> None:
    replay, url = engine
    config = _config(url, advertise_url="http://10.0.0.7:30000/")
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(config, pg_pool, http)
        await agent.heartbeat_once()
        row = await _row(pg_pool, config.worker_id)
        assert row == registry.WorkerInfo(config.worker_id, "http://10.0.0.7:30000", "m", 8, 0)

        replay.running, replay.queued = 3, 2
        await agent.heartbeat_once()
        assert (await _row(pg_pool, config.worker_id)).load == 5

        replay.loads_endpoint = False  # an engine without /v1/loads: read /metrics
        replay.running, replay.queued = 1, 0
        await agent.heartbeat_once()
        assert (await _row(pg_pool, config.worker_id)).load == 1


async def test_heartbeat_registers_again_after_row_vanished(pg_pool, engine) -> None:
    _, url = engine
    config = _config(url)
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(config, pg_pool, http)
        await agent.heartbeat_once()
        await registry.deregister(pg_pool, config.worker_id)
        await agent.heartbeat_once()
        assert await _row(pg_pool, config.worker_id) is not None


async def test_no_heartbeat_while_the_engine_does_not_answer(pg_pool, engine) -> None:
    replay, url = engine
    config = _config(url)
    beat = "SELECT heartbeat_at FROM workers WHERE worker_id = $1"
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(config, pg_pool, http)
        await agent.heartbeat_once()
        first = await pg_pool.fetchval(beat, config.worker_id)
        replay.answering = False
        await agent.heartbeat_once()
        assert await pg_pool.fetchval(beat, config.worker_id) == first  # left to age out
        replay.answering = True
        await agent.heartbeat_once()
        assert await pg_pool.fetchval(beat, config.worker_id) > first


async def test_drain_deregisters_first_then_waits_for_idle(pg_pool, engine) -> None:
    replay, url = engine
    config = _config(url)
    replay.running = 2
    stop = asyncio.Event()
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(config, pg_pool, http)
        task = asyncio.create_task(agent.run(stop))
        deadline = time.monotonic() + 10
        while await _row(pg_pool, config.worker_id) is None:
            assert time.monotonic() < deadline, "agent never registered"
            await asyncio.sleep(0.02)

        stop.set()
        while await _row(pg_pool, config.worker_id) is not None:
            assert time.monotonic() < deadline, "agent never deregistered"
            await asyncio.sleep(0.02)
        # Deregistered but the engine is still busy: the drain must still be waiting.
        await asyncio.sleep(0.5)
        assert not task.done()

        replay.running = 0
        assert await asyncio.wait_for(task, timeout=10) is True


async def test_drain_gives_up_after_timeout(pg_pool, engine) -> None:
    replay, url = engine
    replay.queued = 1
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(_config(url, drain_timeout_s=0.5), pg_pool, http)
        await agent.register()
        assert await agent.drain() is False


async def test_registry_outage_never_raises(pg_dsn, engine) -> None:
    _, url = engine
    lost = await asyncpg.connect(pg_dsn)
    await lost.close()  # every query on it now fails, as during an outage
    async with httpx.AsyncClient() as http:
        agent = WorkerAgent(_config(url), lost, http)
        await agent.heartbeat_once()  # logged, not raised
        assert agent.registered is False
