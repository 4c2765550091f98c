"""Prometheus view of the KV tier ladder (host RAM, NAS, object store) behind a worker.

The tiered store keeps its own counters; this collector reads a snapshot of them at scrape
time (through the ``stats`` callable the composition root hands in, e.g.
``TieredOffload.stats``) so the worker's /metrics shows hits, bytes and failures per tier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.metric_names import TIER_FAILURES, TIER_PREFIX, TIER_STORE_EVENTS, TIER_WRITE_QUEUE
from tiering.tiers.base import TierStats

#: TierStats fields that are levels, not running totals.
_LEVELS = ("used_bytes", "items")

TierStatsSource = Callable[[], Mapping[str, Any]]


class TierCollector(Collector):
    """Per-tier counters and levels, store events and failures, read when scraped."""

    def __init__(self, stats: TierStatsSource) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        tiers: Mapping[str, TierStats] = snapshot.get("tiers", {})
        fields = [f.name for f in dataclasses.fields(TierStats) if f.name != "name"]
        for field in fields:
            name = TIER_PREFIX + field
            doc = f"KV tier {field.replace('_', ' ')}, per tier."
            family = (
                GaugeMetricFamily(name, doc, labels=["tier"])
                if field in _LEVELS
                else CounterMetricFamily(name, doc, labels=["tier"])
            )
            for tier, stats in tiers.items():
                family.add_metric([tier], getattr(stats, field))
            yield family
        events = CounterMetricFamily(
            TIER_STORE_EVENTS,
            "Tiered-store events (writes, hits, misses, drops).",
            labels=["event"],
        )
        for event, count in snapshot.get("store", {}).items():
            events.add_metric([event], count)
        yield events
        failures = CounterMetricFamily(
            TIER_FAILURES,
            "Tier operations that failed and became misses.",
            labels=["tier", "kind"],
        )
        for key, count in snapshot.get("failures", {}).items():
            tier, _, kind = key.partition(".")
            failures.add_metric([tier, kind], count)
        yield failures
        yield GaugeMetricFamily(
            TIER_WRITE_QUEUE,
            "Evicted pages not yet written behind to the NAS (queued or being written).",
            value=snapshot.get("write_queue", 0),
        )
