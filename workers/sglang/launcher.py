"""Run an engine server process under the worker agent: start, wait healthy, serve, drain, stop.

Written for SGLang but engine-agnostic (an argv, its environment and a health URL), so the
same supervision serves any engine that answers ``/health`` and ``/v1/loads``.

Shutdown order on SIGTERM or SIGINT: the agent deregisters and waits for in-flight
requests to finish (see :mod:`workers.agent`), then the engine gets SIGTERM, and SIGKILL
only if it outlives ``stop_timeout_s``. If the engine dies on its own, the agent
deregisters at once and the launcher exits with the engine's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg
import httpx

from workers.agent import AgentConfig, WorkerAgent

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The engine process exited or never became healthy; the message says which and why."""


@dataclass(frozen=True)
class EngineProcessSpec:
    """How to start one engine server and how to tell it is ready."""

    argv: Sequence[str]
    env: Mapping[str, str]
    health_url: str
    #: a large model on a cold disk takes minutes to load
    start_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0


async def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], timeout_s: float, http: httpx.AsyncClient
) -> None:
    """Poll ``url`` until it answers 200; raise :class:`EngineStartError` if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineStartError(
                f"the engine exited with code {proc.returncode} before {url} answered; "
                "its log above says why"
            )
        try:
            if (await http.get(url, timeout=2.0)).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        await asyncio.sleep(0.5)  # probe interval
    raise EngineStartError(f"{url} did not answer 200 within {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM ``proc`` (its whole process group), SIGKILL after ``timeout_s``; its exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # SGLang forks scheduler and detokenizer processes: signal the group, not just the parent.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


async def serve_with_agent(engine: EngineProcessSpec, agent_config: AgentConfig, dsn: str) -> int:
    """Start the engine, keep it registered while it runs, drain and stop it on a signal.

    Returns the exit code for the launcher: 0 after a clean drain, the engine's code if it
    died by itself.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    proc = subprocess.Popen(
        list(engine.argv), env={**os.environ, **engine.env}, start_new_session=True
    )
    log.info("started engine pid %d: waiting for %s", proc.pid, engine.health_url)
    try:
        async with httpx.AsyncClient() as http:
            if await _ready_unless_stopped(engine, proc, stop, http):
                pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
                try:
                    watcher = asyncio.create_task(_set_when_exited(proc, stop))
                    await WorkerAgent(agent_config, pool, http).run(stop)
                    watcher.cancel()
                finally:
                    await pool.close()
        if proc.poll() is not None:
            log.error("engine exited by itself with code %s", proc.returncode)
            return proc.returncode or 1
        return 0 if stop_process(proc, engine.stop_timeout_s) in (0, -signal.SIGTERM) else 1
    finally:
        stop_process(proc, engine.stop_timeout_s)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _ready_unless_stopped(
    engine: EngineProcessSpec,
    proc: subprocess.Popen[bytes],
    stop: asyncio.Event,
    http: httpx.AsyncClient,
) -> bool:
    """Wait for the engine to be healthy; False if told to stop first (a slow model load)."""
    ready = asyncio.create_task(wait_healthy(engine.health_url, proc, engine.start_timeout_s, http))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not ready.done():
        ready.cancel()
        return False
    ready.result()  # raises EngineStartError when the engine did not come up
    return True


async def _set_when_exited(proc: subprocess.Popen[bytes], stop: asyncio.Event) -> None:
    while proc.poll() is None:
        await asyncio.sleep(0.5)  # probe interval
    stop.set()
