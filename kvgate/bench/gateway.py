"""``kvgate bench gateway``: what the gateway adds to a request, and how many it carries.

Set-up: a stub upstream process (``kvgate.bench.stub_upstream``: OpenAI-shaped, no model), one
``kvgate gateway`` process with auth, limits and usage metering all on (a bench team whose
plan is generous enough never to refuse), and Postgres (``DATABASE_URL`` or the embedded
one). The load generator speaks raw HTTP/1.1 over keep-alive connections so that the
client is not what gets measured.

Figures: ``added_p50_ms`` / ``added_p99_ms`` — sequential non-streaming requests through
the gateway minus the same requests sent straight to the upstream (percentile by
percentile); ``rps_nonstream`` / ``rps_stream`` — requests per second through the
gateway at concurrency 64. Targets: added p50 <= 1 ms, p99 <= 5 ms, >= 1000 and >= 500
requests/s. Written to ``--json`` and ``docs/benchmarks/gateway.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import click
import httpx
import orjson

from gateway import accounts
from kvgate.settings import load_settings
from kvgate.stack.ports import free_port
from kvgate.wiring.database import settings_database
from migrations import runner
from protocol import registry

TARGETS = {"added_p50_ms": 1.0, "added_p99_ms": 5.0, "rps_nonstream": 1000, "rps_stream": 500}
_LENGTH = re.compile(rb"content-length: *(\d+)")
_MODEL = "bench-stub"


class _Connection:
    """One keep-alive HTTP/1.1 connection sending a prepared request again and again."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> _Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, raw: bytes) -> int:
        """Send ``raw``, read the whole response, return its status."""
        self.writer.write(raw)
        head = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        status = int(head[9:12])
        if b"transfer-encoding: chunked" in head:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            match = _LENGTH.search(head)
            await self.reader.readexactly(int(match.group(1)) if match else 0)
        return status

    def close(self) -> None:
        self.writer.close()


def _request(path: str, body: dict[str, object], key: str | None) -> bytes:
    payload = orjson.dumps(body)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _sequential(port: int, raw: bytes, count: int) -> list[float]:
    conn = await _Connection.open(port)
    try:
        for _ in range(count // 10):  # warm-up: connections, caches, JIT-free but not cold
            await conn.send(raw)
        out = []
        for _ in range(count):
            start = time.perf_counter()
            status = await conn.send(raw)
            out.append((time.perf_counter() - start) * 1000)
            if status != 200:
                raise click.ClickException(f"benchmark request failed with HTTP {status}")
        return out
    finally:
        conn.close()


async def _throughput(port: int, raw: bytes, concurrency: int, seconds: float) -> tuple[float, int]:
    """Requests per second over ``seconds`` with ``concurrency`` connections; and failures."""
    conns = [await _Connection.open(port) for _ in range(concurrency)]
    done = failed = 0
    end = time.perf_counter() + seconds

    async def loop(conn: _Connection) -> None:
        nonlocal done, failed
        while time.perf_counter() < end:
            status = await conn.send(raw)
            done += 1
            failed += status != 200

    start = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in conns))
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return done / elapsed, failed


@contextlib.contextmanager
def _serve(args: list[str], ready: str, env: dict[str, str]) -> Iterator[None]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready, timeout=1).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise click.ClickException(f"{args[2:4]} did not start:\n{log.read().decode()}")
                time.sleep(0.1)  # readiness polling interval
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=30)


async def _setup(dsn: str, upstream_port: int) -> tuple[str, str]:
    """Migrate, register the stub, make a bench team and key; returns (worker id, key)."""
    conn = await asyncpg.connect(dsn)
    try:
        await runner.migrate(conn)
        await conn.execute(
            """
            INSERT INTO plans VALUES ('bench', 100000000, 2000000000, 900000000000000, 100000,
                                      64, 8192)
            ON CONFLICT (name) DO NOTHING
            """
        )
        team = await accounts.create_team(conn, f"bench-{uuid.uuid4().hex[:8]}", "bench")
        _, key = await accounts.create_key(conn, team.name, "bench")
        worker_id = f"bench-{uuid.uuid4().hex[:8]}"
        await registry.register(conn, worker_id, f"http://127.0.0.1:{upstream_port}", _MODEL, 1024)
        return worker_id, key
    finally:
        await conn.close()


async def _teardown(dsn: str, worker_id: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await registry.deregister(conn, worker_id)
    finally:
        await conn.close()


def _report(figures: dict[str, float]) -> str:
    lines = [
        "# Gateway benchmark",
        "",
        "`kvgate bench gateway`: one gateway process (auth, limits and usage metering on) in",
        "front of a stub upstream (`kvgate.bench.stub_upstream`, no model), Postgres embedded.",
        "Added latency = sequential non-streaming requests through the gateway minus the same",
        "requests sent straight to the upstream; throughput at concurrency 64.",
        "",
        "| figure | measured | target |",
        "|---|---|---|",
    ]
    for name, target in TARGETS.items():
        better = "<=" if name.startswith("added") else ">="
        lines.append(f"| {name} | {figures[name]:.3f} | {better} {target} |")
    lines += ["", "Other figures:", ""]
    lines += [f"- {k}: {v:.3f}" for k, v in figures.items() if k not in TARGETS]
    lines += [
        "",
        f"Measured on {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, with a load",
        f"average of {figures['load_avg_1m']:.1f} from other processes when it started: on a",
        "shared machine every hop between the processes (client, gateway, Postgres, upstream)",
        "waits for a CPU, so these figures are an upper bound on what the gateway costs.",
        "",
    ]
    return "\n".join(lines)


@click.command("gateway")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write figures here.")
@click.option("--requests", "count", default=2000, show_default=True, help="Sequential requests.")
@click.option("--seconds", default=5.0, show_default=True, help="Duration of each throughput run.")
@click.option("--concurrency", default=64, show_default=True, help="Connections for throughput.")
def bench_gateway(json_path: Path | None, count: int, seconds: float, concurrency: int) -> None:
    """Added latency and requests/s of one gateway over a stub upstream."""
    settings = load_settings()
    upstream_port, gateway_port = free_port(), free_port()
    with settings_database(settings) as dsn:
        worker_id, key = asyncio.run(_setup(dsn, upstream_port))
        stub = [sys.executable, "-m", "kvgate.bench.stub_upstream", "--port", str(upstream_port)]
        gw = [sys.executable, "-c", "from kvgate.cli import main; main()", "gateway"]
        gw += ["--port", str(gateway_port)]
        env = {"DATABASE_URL": dsn, "KVGATE_GATEWAY_WORKER_TIMEOUT_S": "3600"}
        try:
            with (
                _serve(stub, f"http://127.0.0.1:{upstream_port}/health", {}),
                _serve(gw, f"http://127.0.0.1:{gateway_port}/readyz", env),
            ):
                figures = asyncio.run(
                    _measure(upstream_port, gateway_port, key, count, seconds, concurrency)
                )
        finally:
            asyncio.run(_teardown(dsn, worker_id))
    click.echo(json.dumps(figures, indent=2))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(figures, indent=2) + "\n")
    docs = Path("docs/benchmarks")
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "gateway.md").write_text(_report(figures))


async def _measure(
    upstream: int, gateway: int, key: str, count: int, seconds: float, concurrency: int
) -> dict[str, float]:
    load = os.getloadavg()[0]
    messages = [{"role": "user", "content": "Say hi."}]
    plain = {"model": _MODEL, "messages": messages, "max_tokens": 4}
    streamed = {**plain, "stream": True}
    path = "/v1/chat/completions"
    # Straight to the upstream with what the gateway would send (usage always asked for).
    direct = await _sequential(upstream, _request(path, plain, None), count)
    through = await _sequential(gateway, _request(path, plain, key), count)
    rps_plain, failed_plain = await _throughput(
        gateway, _request(path, plain, key), concurrency, seconds
    )
    rps_stream, failed_stream = await _throughput(
        gateway, _request(path, streamed, key), concurrency, seconds
    )
    rps_direct, _ = await _throughput(upstream, _request(path, plain, None), concurrency, seconds)
    if failed_plain or failed_stream:
        raise click.ClickException(f"{failed_plain + failed_stream} requests failed under load")
    return {
        "added_p50_ms": _percentile(through, 0.5) - _percentile(direct, 0.5),
        "added_p99_ms": _percentile(through, 0.99) - _percentile(direct, 0.99),
        "rps_nonstream": rps_plain,
        "rps_stream": rps_stream,
        "direct_p50_ms": _percentile(direct, 0.5),
        "direct_p99_ms": _percentile(direct, 0.99),
        "gateway_p50_ms": _percentile(through, 0.5),
        "gateway_p99_ms": _percentile(through, 0.99),
        "rps_upstream_direct": rps_direct,
        "load_avg_1m": load,
    }
