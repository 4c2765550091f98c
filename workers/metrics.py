"""Prometheus metrics of one worker, in a registry of its own (one per app, no globals).

Load figures (queue, running, pool) are read from the engine at scrape time, so they are
never stale; token counters and throughput are fed by the serving layer as events stream.
Throughput is a rate over a sliding window, the figure an operator watches on a dashboard.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.tiers import TIERS
from workers.engine.api import Engine, TokenEvent
from workers.tier_metrics import TierCollector, TierStatsSource

# a `_created` series beside every counter doubles what is scraped and says nothing useful
disable_created_metrics()

#: Seconds of history behind the tokens/s gauges.
RATE_WINDOW_S = 10.0


class RateMeter:
    """Events per second over the last ``window_s`` seconds."""

    def __init__(
        self, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, count: int) -> None:
        """Record ``count`` events now."""
        if count > 0:
            self._samples.append((self._clock(), count))

    def rate(self) -> float:
        """Events per second within the window."""
        horizon = self._clock() - self._window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        return sum(n for _, n in self._samples) / self._window_s


class ServerMetrics:
    """Everything GET /metrics exposes for one worker."""

    def __init__(self, engine: Engine, tier_stats: TierStatsSource | None = None) -> None:
        self.registry = CollectorRegistry()
        self.prefill_rate = RateMeter()
        self.decode_rate = RateMeter()
        self._prompt_tokens = Counter(
            "kvgate_worker_prompt_tokens", "Prompt tokens received.", registry=self.registry
        )
        self._prefill_tokens = Counter(
            "kvgate_worker_prefill_tokens",
            "Prompt tokens computed (not served from a cache).",
            registry=self.registry,
        )
        self._generation_tokens = Counter(
            "kvgate_worker_generation_tokens", "Tokens generated.", registry=self.registry
        )
        self._cached_tokens = Counter(
            "kvgate_worker_cached_tokens",
            "Prompt tokens served from the KV cache, by tier.",
            ["tier"],
            registry=self.registry,
        )
        self._requests = Counter(
            "kvgate_worker_requests",
            "Finished requests, by finish reason.",
            ["finish_reason"],
            registry=self.registry,
        )
        for tier in TIERS:
            self._cached_tokens.labels(tier=tier)
        self.registry.register(_EngineCollector(engine, self))
        if tier_stats is not None:
            self.registry.register(TierCollector(tier_stats))

    def record(self, event: TokenEvent, *, first: bool) -> None:
        """Account one engine event; ``first`` marks a request's first event (prefill done)."""
        if first:
            prefilled = max(event.prompt_tokens - event.cached_tokens, 0)
            self._prompt_tokens.inc(event.prompt_tokens)
            self._prefill_tokens.inc(prefilled)
            self.prefill_rate.add(prefilled)
            for tier, count in event.cached_by_tier.items():
                self._cached_tokens.labels(tier=tier).inc(count)
        self._generation_tokens.inc(len(event.token_ids))
        self.decode_rate.add(len(event.token_ids))

    def finished(self, finish_reason: str) -> None:
        """Count a finished request."""
        self._requests.labels(finish_reason=finish_reason).inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Gauges read from the engine and the rate meters when Prometheus scrapes."""

    def __init__(self, engine: Engine, metrics: ServerMetrics) -> None:
        self._engine = engine
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        load = self._engine.load()
        usage = load.pool_used_pages / load.pool_total_pages if load.pool_total_pages else 0.0
        for name, doc, value in (
            ("kvgate_worker_queue_length", "Requests waiting for admission.", load.queued),
            (
                "kvgate_worker_running_requests",
                "Requests being prefilled or decoded.",
                load.running,
            ),
            (
                "kvgate_worker_pool_used_pages",
                "KV pool pages in use or cached.",
                load.pool_used_pages,
            ),
            ("kvgate_worker_pool_total_pages", "KV pool capacity in pages.", load.pool_total_pages),
            ("kvgate_worker_pool_usage_ratio", "Fraction of KV pool pages in use.", usage),
            (
                "kvgate_worker_cached_pages",
                "Pages held by the radix prefix cache.",
                load.cached_pages,
            ),
            (
                "kvgate_worker_prefill_tokens_per_second",
                f"Prompt tokens computed per second over the last {RATE_WINDOW_S:g} s.",
                self._metrics.prefill_rate.rate(),
            ),
            (
                "kvgate_worker_decode_tokens_per_second",
                f"Tokens generated per second over the last {RATE_WINDOW_S:g} s.",
                self._metrics.decode_rate.rate(),
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, value in (
            (
                "kvgate_worker_preemptions",
                "Requests sent back to the queue to free KV pages.",
                load.preemptions,
            ),
            (
                "kvgate_worker_evicted_pages",
                "KV pages the prefix cache evicted to make room in the pool.",
                load.evicted_pages,
            ),
            (
                "kvgate_worker_prefill_seconds",
                "Seconds the engine spent computing prompt tokens.",
                load.prefill_seconds,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
