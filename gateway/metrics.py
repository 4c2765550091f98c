"""Prometheus metrics of one gateway replica, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ADDED_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


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
            "kvgate_gateway_tokens", "Tokens served, by kind.", ["kind"], registry=r
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
        self.usage_pending = Gauge(
            "kvgate_gateway_usage_pending", "Usage rows waiting to be written.", registry=r
        )
        self.usage_dropped = Gauge(
            "kvgate_gateway_usage_dropped", "Usage rows dropped (buffer full).", registry=r
        )
        self.workers = Gauge(
            "kvgate_gateway_workers", "Healthy workers in the registry.", registry=r
        )

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
