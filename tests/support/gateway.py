"""Helpers for the gateway tests: real processes (gateways, stub upstreams) and accounts.

Upstreams here are ``kvgate.bench.stub_upstream`` processes — an OpenAI-shaped stand-in, not a
model — except where a test says it uses the built-in worker.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from gateway import accounts
from gateway.accounts import Plan
from gateway.auth import Principal
from kvgate.stack.ports import free_port
from protocol import registry

#: The ``kvgate`` command line, run by this interpreter (no installed script needed).
KVGATE = [sys.executable, "-c", "from kvgate.cli import main; main()"]


def wait_http(
    url: str, deadline_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``url`` until it answers 200 (or fail if ``proc`` exits first)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)  # polling interval of a readiness probe, not synchronisation
    raise TimeoutError(f"{url} did not answer within {deadline_s}s")


@contextlib.contextmanager
def process(
    args: list[str],
    ready_url: str,
    env: dict[str, str] | None = None,
    ready_s: float = 30.0,
    *,
    wait: bool = True,
    log: Path | None = None,
    stop_s: float = 20.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` until the block ends; yields once ``ready_url`` answers (at once with
    ``wait=False``, so that slow starters can start side by side).

    Output goes to a file (a pipe nobody drains would block a chatty process): ``log``
    when the test reads it, else a temporary one; it is printed when the block fails, so
    pytest shows it with the failure. At the end the process gets SIGTERM and ``stop_s``
    seconds to exit before SIGKILL.
    """
    with log.open("w+b") if log is not None else tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            args, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            if wait:
                wait_http(ready_url, ready_s, proc=proc)
            yield proc
        except BaseException:
            out.seek(0)
            print(f"--- output of {args[:6]} ---\n{out.read().decode(errors='replace')[-20000:]}")
            raise
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=stop_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextlib.contextmanager
def stub_upstream(worker_id: str, *flags: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``kvgate.bench.stub_upstream`` process; yields its base URL and the process."""
    port = free_port()
    args = [sys.executable, "-m", "kvgate.bench.stub_upstream", "--port", str(port)]
    args += ["--worker-id", worker_id, *flags]
    url = f"http://127.0.0.1:{port}"
    with process(args, url + "/health") as proc:
        yield url, proc


def gateway_env(dsn: str, **extra: str) -> dict[str, str]:
    """Environment for a gateway process on ``dsn`` that trusts loopback proxies."""
    env = {
        "DATABASE_URL": dsn,
        "KVGATE_GATEWAY_TRUSTED_PROXIES": '["127.0.0.1/32"]',
        # Test upstreams do not heartbeat; tests deregister what they register.
        "KVGATE_GATEWAY_WORKER_TIMEOUT_S": "3600",
        "KVGATE_DB_POOL_MIN": "1",
        "KVGATE_DB_POOL_MAX": "4",
    }
    env.update(extra)
    return env


@contextlib.contextmanager
def gateway_process(dsn: str, **extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``kvgate gateway`` process; yields its base URL and the process."""
    port = free_port()
    args = [*KVGATE, "gateway", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with process(args, url + "/readyz", gateway_env(dsn, **extra)) as proc:
        yield url, proc


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def register_workers(
    pool: asyncpg.Pool, model: str, urls: dict[str, str], capacity: int = 8
) -> None:
    """Put ``urls`` (worker id -> base URL) in the registry as workers serving ``model``."""
    for worker_id, url in urls.items():
        await registry.register(pool, worker_id, url, model, capacity)


async def deregister(pool: asyncpg.Pool, worker_ids: list[str]) -> None:
    """Remove workers from the registry."""
    for worker_id in worker_ids:
        await registry.deregister(pool, worker_id)


async def team_key(pool: asyncpg.Pool, plan: str = "team", **plan_limits: Any) -> tuple[int, str]:
    """A new team (on a fresh plan when ``plan_limits`` are given) and one key: (team id, secret)."""
    if plan_limits:
        plan = unique("plan")
        limits = {
            "requests_per_min": 1000,
            "tokens_per_min": 1_000_000,
            "tokens_per_day": 100_000_000,
            "max_concurrent": 64,
            "max_max_tokens": 256,
            "max_context": 8192,
            **plan_limits,
        }
        await pool.execute(
            "INSERT INTO plans VALUES ($1, $2, $3, $4, $5, $6, $7)", plan, *limits.values()
        )
    team = await accounts.create_team(pool, unique("team"), plan)
    _, secret = await accounts.create_key(pool, team.name)
    return team.id, secret


def poll(condition: Any, deadline_s: float = 10.0, what: str = "condition") -> None:
    """Wait until ``condition()`` is true, failing after ``deadline_s`` seconds."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {deadline_s}s")
        time.sleep(0.02)  # polling interval, not synchronisation


async def apoll(probe: Any, done: Any, deadline_s: float = 10.0, what: str = "condition") -> Any:
    """Await ``probe()`` until ``done(result)``; returns the last result or fails at the deadline."""
    import asyncio

    end = time.monotonic() + deadline_s
    while True:
        result = await probe()
        if done(result):
            return result
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {deadline_s}s (last: {result!r})")
        await asyncio.sleep(0.05)  # polling interval, not synchronisation


def principal(plan: Plan, *, anonymous: bool = False) -> Principal:
    """A fresh team (or anonymous client) on ``plan``, unknown to every limit so far."""
    tag = uuid.uuid4().hex[:10]
    if anonymous:
        return Principal(f"ip:{tag}", plan, None, None, "salt", "203.0.113.9")
    return Principal(f"team:{tag}", plan, 1, 1, "salt", "203.0.113.9")


def plan_with(**kw: int) -> Plan:
    """A plan generous in everything but what ``kw`` sets."""
    base = dict(
        requests_per_min=1000,
        tokens_per_min=1_000_000,
        tokens_per_day=10_000_000,
        max_concurrent=100,
        max_max_tokens=100,
        max_context=1000,
    )
    base.update(kw)
    return Plan(name="test", **base)  # type: ignore[arg-type]


@dataclass
class StubRig:
    """A gateway process in front of one stub upstream that serves a model of its own,
    and a team with a key."""

    url: str
    upstream: str
    model: str
    key: str
    team_id: int


@contextlib.asynccontextmanager
async def stub_rig(dsn: str, pool: asyncpg.Pool, name: str) -> AsyncIterator[StubRig]:
    """A :class:`StubRig` whose model and worker are named after ``name``."""
    model = unique(f"m-{name}")
    with stub_upstream(f"w-{name}") as (upstream, _):
        worker = unique(f"w-{name}")
        await register_workers(pool, model, {worker: upstream})
        team_id, key = await team_key(pool)
        with gateway_process(dsn, KVGATE_GATEWAY_BODY_LIMIT="20000") as (url, _):
            yield StubRig(url, upstream, model, key, team_id)
        await deregister(pool, [worker])


def free_tier_address() -> str:
    """A client address of its own, so a free-tier test has limits of its own (the test
    gateways believe loopback's X-Forwarded-For)."""
    return f"198.18.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"
