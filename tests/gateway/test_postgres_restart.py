"""Postgres restarted under traffic: every request still gets exactly one usage row.

This test runs its own embedded Postgres (so it can stop and start it) and a stub
upstream (``kvgate.bench.stub_upstream``, an OpenAI-shaped stand-in, not a model).
"""

from __future__ import annotations

import threading
from pathlib import Path

import asyncpg
import httpx
import pgserver

from gateway import accounts, keys
from kvgate.stack.postgres import embedded_postgres
from migrations import runner
from protocol import registry
from tests.support.gateway import apoll, gateway_process, poll, stub_upstream, team_key, unique


def _traffic(
    url: str, key: str, model: str, stop: threading.Event, done: list[tuple[str, int]]
) -> None:
    """Send chat requests one after another (streaming every other) until ``stop``."""
    with httpx.Client(timeout=30) as client:
        i = 0
        while not stop.is_set():
            try:
                response = client.post(
                    url + "/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}", "x-session-id": f"s{i % 4}"},
                    json={
                        "model": model,
                        "max_tokens": 3,
                        "stream": i % 2 == 1,
                        "messages": [{"role": "user", "content": f"hi {i}"}],
                    },
                )
                done.append((response.headers["x-request-id"], response.status_code))
            except httpx.HTTPError as exc:
                done.append((repr(exc), -1))
            i += 1


async def test_usage_survives_a_postgres_restart_exactly_once(tmp_path: Path) -> None:
    with embedded_postgres(tmp_path / "pg") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await runner.migrate(conn)
            model, worker = unique("m-pg"), unique("w-pg")
            team = await accounts.create_team(conn, unique("team"))
            _, key = await accounts.create_key(conn, team.name)
        finally:
            await conn.close()
        server = pgserver.get_server(tmp_path / "pg")
        done: list[tuple[str, int]] = []
        stop = threading.Event()
        with (
            stub_upstream(worker) as (upstream, _),
            gateway_process(dsn, KVGATE_GATEWAY_USAGE_FLUSH_S="0.2") as (url, _),
        ):
            conn = await asyncpg.connect(dsn)
            await registry.register(conn, worker, upstream, model, 8)
            await conn.close()
            poll(lambda: model in httpx.get(url + "/v1/models").text, what="worker listed")
            sender = threading.Thread(target=_traffic, args=(url, key, model, stop, done))
            sender.start()
            try:
                poll(lambda: len(done) >= 10, what="traffic before the outage")
                pgserver.pg_ctl(
                    ["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user
                )
                during = len(done)
                poll(lambda: len(done) >= during + 10, what="traffic during the outage")
                # Keys seen before keep working (above); a key never seen cannot be checked.
                unknown = httpx.post(
                    url + "/v1/chat/completions",
                    headers={"authorization": f"Bearer {keys.mint().secret}"},
                    json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                )
                assert unknown.status_code == 503, unknown.text
                server.ensure_postgres_running()
                after = len(done)
                poll(lambda: len(done) >= after + 10, what="traffic after the outage")
            finally:
                stop.set()
                sender.join()
            assert all(status == 200 for _, status in done), done
            ids = [request_id for request_id, _ in done]

            conn = await asyncpg.connect(dsn)
            try:
                rows = await apoll(
                    lambda: conn.fetch("SELECT request_id FROM usage WHERE team_id = $1", team.id),
                    lambda rows: len(rows) >= len(ids),
                    deadline_s=30,
                    what="a usage row for every request",
                )
                assert sorted(r["request_id"] for r in rows) == sorted(ids)
                daily = await conn.fetchval(
                    "SELECT requests FROM usage_daily WHERE team_id = $1", team.id
                )
                assert daily == len(ids)
            finally:
                await conn.close()


async def test_buffered_usage_is_written_at_shutdown(pg_dsn: str, pg_pool: asyncpg.Pool) -> None:
    model, worker = unique("m-shutdown"), unique("w-shutdown")
    team_id, key = await team_key(pg_pool)
    with stub_upstream(worker) as (upstream, _):
        await registry.register(pg_pool, worker, upstream, model, 8)
        # The longest flush interval allowed: the row is still in memory at shutdown.
        with gateway_process(pg_dsn, KVGATE_GATEWAY_USAGE_FLUSH_S="1") as (url, proc):
            response = httpx.post(
                url + "/v1/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": model, "prompt": "hi", "max_tokens": 2},
            )
            assert response.status_code == 200
            proc.terminate()
            # uvicorn shuts down gracefully, then re-raises SIGTERM: -15 is a clean exit.
            assert proc.wait(timeout=30) in (0, -15)
        await registry.deregister(pg_pool, worker)
    row = await pg_pool.fetchrow(
        "SELECT team_id, completion_tokens FROM usage WHERE request_id = $1",
        response.headers["x-request-id"],
    )
    assert row is not None and tuple(row) == (team_id, 2)
