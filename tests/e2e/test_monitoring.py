"""``kvgate up --monitoring``: a real Prometheus scrapes the running stack with kvgate's alert
rules loaded, and once traffic has flowed every query of the Grafana dashboard
(``infra/grafana/kvgate.json``) returns series."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

from kvgate.stack.ports import free_port
from protocol import registry
from tests.support.commands import kvgate_env
from tests.support.stack import start_up

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "kvgate.json"
RULES = ROOT / "infra" / "prometheus" / "kvgate-rules.yml"
STARTUP_DEADLINE_S = 180.0
QUERY_DEADLINE_S = 90.0
MODEL = "tiny-random"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def _chat(client: httpx.Client, messages: list[dict], **fields: object) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, **fields}
    return client.post("/v1/chat/completions", json=body)


def _team_key(home: Path) -> str:
    env = kvgate_env(home)
    team = f"ops-{uuid.uuid4().hex[:8]}"
    for argv in (["teams", "create", team], ["keys", "create", "--team", team]):
        done = subprocess.run(
            [sys.executable, "-m", "kvgate", "admin", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    return re.search(r"kvg_\S+", done.stdout).group(0)


def _traffic(gateway: str, worker: str, key: str) -> None:
    """Cache hits from the pool and from host RAM, a stream, a bad request, and 429s."""
    team = httpx.Client(base_url=gateway, headers={"authorization": f"Bearer {key}"}, timeout=60)
    history = [{"role": "user", "content": "Tell me about tiered KV caches, " * 8}]
    for turn in range(3):
        reply = _chat(team, history)
        assert reply.status_code == 200, reply.text
        history += [
            {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"and then? ({turn})"},
        ]
    httpx.post(f"{worker}/flush_cache", timeout=30).raise_for_status()  # the pool forgets
    assert _chat(team, history).status_code == 200  # back from the lower tiers
    streamed = _chat(team, history, stream=True, stream_options={"include_usage": True})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert _chat(team, []).status_code == 400
    anonymous = httpx.Client(base_url=gateway, timeout=60)
    statuses = {_chat(anonymous, history[:1], max_tokens=1).status_code for _ in range(12)}
    assert 429 in statuses  # the free plan allows 10 requests a minute


async def _an_upstream_error(dsn: str, gateway: str, key: str) -> None:
    """A registered worker that does not answer: the gateway retries elsewhere and counts it."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    dead = f"http://127.0.0.1:{free_port()}"
    headers = {"authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=60) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await registry.register(pool, "dead-worker", dead, MODEL, 8)
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                }
                session = {"x-session-id": uuid.uuid4().hex}
                reply = await client.post("/v1/chat/completions", json=body, headers=session)
                assert reply.status_code == 200, reply.text
                metrics = (await client.get("/metrics")).text
                if re.search(r"^kvgate_gateway_upstream_errors_total\{.*\} [1-9]", metrics, re.M):
                    return
            raise AssertionError("no request was routed to the dead worker within 60 s")
    finally:
        await registry.deregister(pool, "dead-worker")
        await pool.close()


def _query(prometheus: str, expr: str) -> list[dict]:
    reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    assert reply.status_code == 200, f"{expr}: {reply.text}"
    return reply.json()["data"]["result"]


def test_prometheus_loads_the_rules_and_every_dashboard_query_returns_series(home: Path) -> None:
    proc, lines = start_up(home, "--monitoring")
    try:
        dsn = lines.wait_for(r"^ready  postgres  ", STARTUP_DEADLINE_S).split("  ")[2]
        worker = lines.wait_for(r"^ready  worker  ", STARTUP_DEADLINE_S).split("  ")[2]
        gateway = lines.wait_for(r"^ready  gateway  ", STARTUP_DEADLINE_S).split("  ")[2]
        prometheus = lines.wait_for(r"^ready  prometheus  ", STARTUP_DEADLINE_S).split("  ")[2]
        lines.wait_for(r"^stack is up", STARTUP_DEADLINE_S)

        rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        loaded = {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"}
        assert loaded == set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
        assert len(loaded) >= 8

        key = _team_key(home)
        _traffic(gateway, worker, key)
        asyncio.run(_an_upstream_error(dsn, gateway, key))
        scraped = httpx.get(f"{gateway}/metrics").text + httpx.get(f"{worker}/metrics").text
        restored = re.findall(
            r'^kvgate_gateway_cached_tokens_total\{tier="(?:host|nas|object)"\} (\S+)',
            scraped,
            re.M,
        )
        assert sum(float(v) for v in restored) > 0  # the turn after the flush came from a tier
        for secret in (key, key[:12], "tiered KV caches", "@"):  # no key, prompt or email
            assert secret not in scraped

        queries = dashboard_queries()
        empty = list(queries)
        deadline = time.monotonic() + QUERY_DEADLINE_S
        while empty and time.monotonic() < deadline:  # polled: until the scrapes after the traffic
            empty = [(title, expr) for title, expr in empty if not _query(prometheus, expr)]
            time.sleep(0.5 if empty else 0)
        assert empty == [], f"{len(empty)} of {len(queries)} dashboard queries return nothing"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
