"""The agent registers a built-in worker, the gateway routes to it, and SIGTERM
drains it without failing the request in flight.

Real processes throughout: ``kvgate agent -- kvgate worker --model tiny-random`` (the
built-in engine on CPU under the agent), ``kvgate gateway``, and the session Postgres as
the worker registry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx

from kvgate.stack.ports import free_port
from protocol import registry
from tests.support.gateway import apoll, gateway_process, team_key, unique

MODEL = "tiny-random"
LONG = 1000  # tokens: long enough that the SIGTERM lands while the stream is running
_KVGATE = [sys.executable, "-c", "from kvgate.cli import main; main()"]


async def _registered(pg_pool: asyncpg.Pool, worker_id: str) -> bool:
    return any(w.worker_id == worker_id for w in await registry.list_healthy(pg_pool, 60))


async def test_agent_registers_gateway_routes_and_sigterm_drains_in_flight(
    pg_dsn: str, pg_pool: asyncpg.Pool, smollm2_gguf: Path, nas_dir: Path
) -> None:
    worker_id = unique("w-agent")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": pg_dsn,
        # tiny-random borrows SmolLM2's tokenizer: use the test cache it was downloaded to.
        "KVGATE_HOME": str(smollm2_gguf.parent.parent),
        "KVGATE_NAS_PATH": str(nas_dir),
    }
    agent_cmd = [*_KVGATE, "agent", "--url", url, "--model", MODEL, "--worker-id", worker_id]
    agent_cmd += ["--heartbeat", "0.5", "--drain-quiet", "2", "--"]
    agent_cmd += [*_KVGATE, "worker", "--model", MODEL, "--port", str(port)]
    log = nas_dir.parent / "agent.log"  # a file, not a pipe: nobody reads it while it runs
    with log.open("wb") as sink:
        agent = subprocess.Popen(agent_cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        # Loading torch and building the engine takes a while on a shared CPU.
        await apoll(lambda: _registered(pg_pool, worker_id), bool, 180, "agent registration")
        _, key = await team_key(pg_pool, max_max_tokens=2 * LONG)
        # Only workers that heartbeat within 5 s count, so stale rows of other tests do not.
        with gateway_process(pg_dsn, KVGATE_GATEWAY_WORKER_TIMEOUT_S="5") as (gateway, _):
            body = {
                "model": MODEL,
                "prompt": "Once upon a time",
                "max_tokens": LONG,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            headers = {"authorization": f"Bearer {key}"}
            events: list[str] = []
            async with (
                httpx.AsyncClient(timeout=120) as client,
                client.stream(
                    "POST", f"{gateway}/v1/completions", json=body, headers=headers
                ) as resp,
            ):
                assert resp.status_code == 200, await resp.aread()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line.removeprefix("data: "))
                    if len(events) == 1:  # the request is in flight on our worker: stop it
                        agent.send_signal(signal.SIGTERM)
                        await apoll(
                            lambda: _registered(pg_pool, worker_id),
                            lambda present: not present,
                            10,
                            "deregistration on SIGTERM",
                        )

        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == LONG
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        assert finish[-1] == "length"
        # The drain waited for the request, then stopped the worker and exited cleanly.
        assert agent.wait(60) == 0, log.read_text()[-3000:]
        assert not await _registered(pg_pool, worker_id)
        with httpx.Client() as probe:
            try:
                probe.get(f"{url}/health", timeout=2)
                raise AssertionError("the worker still answers after the agent exited")
            except httpx.ConnectError:
                pass
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
