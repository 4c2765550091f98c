"""The worker agent: keeps one engine listed in the worker registry while it can serve.

It is engine-agnostic — the built-in worker and an SGLang server both answer the same
probes — so it only speaks HTTP to the engine and SQL (``protocol.registry``) to Postgres:

- ``register`` once the engine is healthy, under a stable worker id;
- ``heartbeat`` every ``heartbeat_interval_s`` with the engine's load (requests running
  plus waiting), read from ``GET /v1/loads`` and, failing that, from ``GET /metrics``;
  a heartbeat that finds its row gone (a reaped or restarted registry) registers again,
  and an engine that answers neither probe gets no heartbeat, so that gateways age it out;
- on shutdown, **drain**: deregister first so that gateways stop choosing this worker at
  their next registry refresh, then keep probing until the engine has been idle for
  ``drain_quiet_s`` (long enough for every gateway to have refreshed) or
  ``drain_timeout_s`` passes. Only then may the caller stop the engine, so that no
  in-flight request is cut off.

A registry outage never stops the engine: failed heartbeats are logged at a bounded rate
and retried on the next tick, since gateways age out a silent worker on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from protocol import registry

log = logging.getLogger(__name__)

# Gauge names SGLang exposes on /metrics (the built-in worker mirrors them).
_RUNNING_GAUGES = ("sglang:num_running_reqs", "sglang_num_running_reqs")
_QUEUED_GAUGES = ("sglang:num_queue_reqs", "sglang_num_queue_reqs")


@dataclass(frozen=True)
class AgentConfig:
    """Who this worker is and how its agent paces itself."""

    worker_id: str
    #: where the agent probes the engine (usually loopback)
    engine_url: str
    #: what the gateways should call; defaults to ``engine_url``
    advertise_url: str | None
    model: str
    #: requests this worker is sized to run at once (gateways balance on load/capacity)
    capacity: int
    heartbeat_interval_s: float = 1.0
    drain_quiet_s: float = 3.0
    drain_timeout_s: float = 120.0
    probe_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"capacity must be positive, got {self.capacity}")
        if self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be positive")

    @property
    def url(self) -> str:
        """The URL written to the registry."""
        return (self.advertise_url or self.engine_url).rstrip("/")


def load_from_loads_json(body: Any) -> int | None:
    """Running plus waiting requests from a ``/v1/loads`` body (summed over DP ranks)."""
    try:
        ranks = body["loads"]
        return sum(
            int(r.get("num_running_reqs", 0)) + int(r.get("num_waiting_reqs", 0)) for r in ranks
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def load_from_metrics_text(text: str) -> int | None:
    """Running plus queued requests from Prometheus exposition text, or None if absent."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _RUNNING_GAUGES + _QUEUED_GAUGES:
                    found[sample.name] = found.get(sample.name, 0.0) + sample.value
    except ValueError:
        return None
    if not any(name in found for name in _RUNNING_GAUGES):
        return None
    return int(sum(found.values()))


class WorkerAgent:
    """Registers, heartbeats and drains one engine; see the module docstring."""

    def __init__(self, config: AgentConfig, db: Any, http: httpx.AsyncClient) -> None:
        self.config = config
        self._db = db
        self._http = http
        self._last_error_log = 0.0
        self.registered = False

    async def read_load(self) -> int | None:
        """The engine's current load, or None when it answers neither probe."""
        base = self.config.engine_url.rstrip("/")
        timeout = self.config.probe_timeout_s
        try:
            resp = await self._http.get(f"{base}/v1/loads", timeout=timeout)
            if resp.status_code == 200:
                load = load_from_loads_json(resp.json())
                if load is not None:
                    return load
        except (httpx.HTTPError, ValueError) as exc:
            self._log_bounded("engine /v1/loads probe failed: %s", exc)
        try:
            resp = await self._http.get(f"{base}/metrics", timeout=timeout)
            if resp.status_code == 200:
                return load_from_metrics_text(resp.text)
        except httpx.HTTPError as exc:
            self._log_bounded("engine /metrics probe failed: %s", exc)
        return None

    async def register(self) -> None:
        """Put this worker in the registry (idempotent)."""
        c = self.config
        await registry.register(self._db, c.worker_id, c.url, c.model, c.capacity)
        self.registered = True
        log.info("registered worker %s at %s (model %s)", c.worker_id, c.url, c.model)

    async def heartbeat_once(self) -> None:
        """Report the current load; register again if the row has disappeared.

        An engine that answers neither load probe gets no heartbeat: it may be hung, and
        the gateways should age it out rather than keep sending it requests.
        """
        load = await self.read_load()
        if load is None:
            self._log_bounded(
                "engine at %s is not answering: heartbeat withheld", self.config.engine_url
            )
            return
        try:
            if not self.registered or not await registry.heartbeat(
                self._db, self.config.worker_id, load
            ):
                await self.register()
        except Exception as exc:  # a registry outage must never stop serving
            self._log_bounded("worker registry unreachable: %s", exc)

    async def run(self, stop: asyncio.Event) -> bool:
        """Heartbeat until ``stop`` is set, then drain; returns whether the drain finished idle."""
        while not stop.is_set():
            await self.heartbeat_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.heartbeat_interval_s)
        return await self.drain()

    async def drain(self) -> bool:
        """Deregister, then wait for the engine to stay idle for ``drain_quiet_s``.

        Returns True when it did, False when ``drain_timeout_s`` ran out first (the caller
        stops the engine either way).
        """
        try:
            await registry.deregister(self._db, self.config.worker_id)
        except Exception as exc:
            self._log_bounded("could not deregister (gateways will age this worker out): %s", exc)
        self.registered = False
        deadline = time.monotonic() + self.config.drain_timeout_s
        idle_since: float | None = None
        poll = min(0.2, self.config.drain_quiet_s / 4)
        while (now := time.monotonic()) < deadline:
            load = await self.read_load()
            if load:
                idle_since = None
            elif load == 0:
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.config.drain_quiet_s:
                    log.info("worker %s drained", self.config.worker_id)
                    return True
            else:  # the engine is gone: nothing left to drain
                return True
            await asyncio.sleep(poll)  # the probe interval, not a synchronisation
        log.warning(
            "worker %s still busy after %.0f s; stopping anyway",
            self.config.worker_id,
            self.config.drain_timeout_s,
        )
        return False

    def _log_bounded(self, msg: str, *args: object) -> None:
        # One line per 10 s: a flapping registry or engine must not flood the log.
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:
            self._last_error_log = now
            log.warning(msg, *args)
