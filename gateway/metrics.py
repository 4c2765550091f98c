"""Prometheus metrics of one gateway replica, in a registry of its own (no global state).

Names follow Prometheus' conventions (``kvgate_`` prefix, base units, ``_total`` counters);
``docs/metrics.md`` lists every metric of every process. No label carries a key, an email
or a prompt: requests are labelled by endpoint, status and plan, tokens by kind and tier,
errors by worker id and kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.tiers import TIERS

# a `_created` series beside every counter doubles what is scraped and says nothing useful
disable_created_metrics()

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ADDED_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)

#: the kinds of ``kvgate_gateway_tokens_total``: the three things a team is billed for
TOKEN_KINDS = ("input", "cached", "output")


@dataclass(frozen=True)
class ReplicaState:
    """What the gateway reads from its parts when scraped (always current, never stale)."""

    usage_pending: Callable[[], int]
    usage_dropped: Callable[[], int]
    healthy_workers: Callable[[], int]


class GatewayMetrics:
    """Counters and histograms for requests, tokens, limits, upstreams and own overhead."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kvgate_gateway_requests",
            "Requests answered, by endpoint, HTTP status and plan.",
            ["endpoint", "status", "plan"],
            registry=r,
        )
        self.latency = Histogram(
            "kvgate_gateway_request_seconds",
            "Time from request to last byte, by endpoint.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_gateway_ttft_seconds",
            "Time to the first streamed token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.added = Histogram(
            "kvgate_gateway_added_seconds",
            "Time the gateway itself adds (auth, limits, routing, proxying).",
            buckets=_ADDED_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "kvgate_gateway_tokens",
            "Tokens served, by kind: input (prompt tokens computed), cached (prompt tokens "
            "served from the KV cache), output.",
            ["kind"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "kvgate_gateway_cached_tokens",
            "Prompt tokens served from the KV cache, by the tier they came from.",
            ["tier"],
            registry=r,
        )
        self.rate_limited = Counter(
            "kvgate_gateway_rate_limited",
            "Requests refused with 429, by reason and plan.",
            ["reason", "plan"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "kvgate_gateway_upstream_errors",
            "Failed upstream attempts, by worker and kind (connect, status, midstream).",
            ["worker", "kind"],
            registry=r,
        )
        self.degraded = Counter(
            "kvgate_gateway_degraded",
            "Admissions made without Postgres (limits counted by this replica alone), by what.",
            ["what"],
            registry=r,
        )
        self.billing_unreported = Gauge(
            "kvgate_billing_unreported_seconds",
            "Age of the oldest usage of a paying team not yet sent to Stripe's meters "
            "(0: all sent). Usage is reported by the hour, so this reaches about 1.5 h.",
            registry=r,
        )
        for kind in TOKEN_KINDS:
            self.tokens.labels(kind)
        for tier in TIERS:
            self.cached_tokens.labels(tier)

    def watch(self, state: ReplicaState) -> None:
        """Export ``state``'s figures, read at each scrape."""
        self.registry.register(_ReplicaCollector(state))

    def count_tokens(self, prompt: int, cached: int, output: int, by_tier: dict[str, int]) -> None:
        """Account one request's usage."""
        self.tokens.labels("input").inc(max(prompt - cached, 0))
        self.tokens.labels("cached").inc(cached)
        self.tokens.labels("output").inc(output)
        for tier, count in by_tier.items():
            self.cached_tokens.labels(tier).inc(count)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


class _ReplicaCollector(Collector):
    def __init__(self, state: ReplicaState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kvgate_gateway_usage_pending",
            "Usage rows waiting to be written.",
            value=self._state.usage_pending(),
        )
        yield CounterMetricFamily(
            "kvgate_gateway_usage_dropped",
            "Usage rows dropped because the buffer was full (lost usage).",
            value=self._state.usage_dropped(),
        )
        yield GaugeMetricFamily(
            "kvgate_gateway_workers",
            "Healthy workers in the registry.",
            value=self._state.healthy_workers(),
        )
