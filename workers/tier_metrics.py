"""Prometheus view of the KV tier ladder (host RAM, NAS, object store) behind a worker.

The tiered store keeps its own counters; this collector reads a snapshot of them at scrape
time (through the ``stats`` callable the composition root hands in, e.g.
``TieredOffload.stats``) so the worker's /metrics shows hits, bytes and failures per tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.metric_names import (
    TIER_FAILURES,
    TIER_FETCH_SECONDS,
    TIER_FIGURES,
    TIER_PREFIX,
    TIER_STORE_EVENTS,
    TIER_WRITE_DROPPED,
    TIER_WRITE_QUEUE,
)
from tiering.tiers.base import TierStats

TierStatsSource = Callable[[], Mapping[str, Any]]

#: how a restore from any tier can fail (a read error, a read past its deadline): exported
#: at zero for every tier from the first scrape, so alerts and dashboards see the series
RESTORE_FAILURES = ("read", "deadline")


class TierCollector(Collector):
    """Per-tier counters and levels, fetch time, store events and failures, read when scraped.

    Every tier the store has gets every figure, at zero until it moves, so a dashboard or an
    alert over a tier finds its series from the first scrape.
    """

    def __init__(self, stats: TierStatsSource) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        tiers: Mapping[str, TierStats] = snapshot.get("tiers", {})
        for field, suffix in TIER_FIGURES.items():
            name = TIER_PREFIX + suffix
            doc = f"KV tier {field.replace('_', ' ')}, per tier."
            family = (
                CounterMetricFamily(name, doc, labels=["tier"])
                if suffix.endswith("_total")
                else GaugeMetricFamily(name, doc, labels=["tier"])
            )
            for tier, stats in tiers.items():
                family.add_metric([tier], getattr(stats, field))
            yield family
        fetch = CounterMetricFamily(
            TIER_FETCH_SECONDS, "Seconds spent reading restores, per tier.", labels=["tier"]
        )
        seconds = snapshot.get("fetch_seconds", {})
        for tier in tiers:
            fetch.add_metric([tier], seconds.get(tier, 0.0))
        yield fetch
        events = CounterMetricFamily(
            TIER_STORE_EVENTS,
            "Tiered-store events (writes, hits, misses, drops).",
            labels=["event"],
        )
        store = snapshot.get("store", {})
        for event, count in store.items():
            events.add_metric([event], count)
        yield events
        yield CounterMetricFamily(
            TIER_WRITE_DROPPED,
            "Evicted pages the write-behind dropped: its queue to the NAS was full.",
            value=store.get("write_dropped", 0),
        )
        failures = CounterMetricFamily(
            TIER_FAILURES,
            "Tier operations that failed and became misses.",
            labels=["tier", "kind"],
        )
        counts = dict.fromkeys((f"{t}.{k}" for t in tiers for k in RESTORE_FAILURES), 0)
        counts.update(snapshot.get("failures", {}))
        for key, count in counts.items():
            tier, _, kind = key.partition(".")
            failures.add_metric([tier, kind], count)
        yield failures
        yield GaugeMetricFamily(
            TIER_WRITE_QUEUE,
            "Evicted pages not yet written behind to the NAS (queued or being written).",
            value=snapshot.get("write_queue", 0),
        )
