"""Prometheus view of tierd: what its passes did, and how full the shared tiers are.

tierd is the one process that measures the shared tiers (the ledger's bytes per tier), so
the NAS-above-its-watermark alert and the capacity panels read these. A registry of its
own, served by ``kvgate tierd`` on ``KVGATE_TIERD_METRICS_PORT``.
"""

from __future__ import annotations

import dataclasses
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

from tiering.tierd import PassReport, TierdConfig

# a `_created` series beside every counter doubles what is scraped and says nothing useful
disable_created_metrics()

#: the page counts of a pass report, by what happened to the pages
ACTIONS = tuple(
    f.name
    for f in dataclasses.fields(PassReport)
    if f.type in ("int", int) and not f.name.endswith("_bytes")
)


class TierdMetrics:
    """Counters of passes and pages, and the tiers' sizes as of the last pass."""

    def __init__(self, config: TierdConfig) -> None:
        self.registry = r = CollectorRegistry()
        self.passes = Counter(
            "kvgate_tierd_passes",
            "tierd passes, by result: ok, skipped (another tierd held the pass), failed.",
            ["result"],
            registry=r,
        )
        self.pages = Counter(
            "kvgate_tierd_pages", "Pages tierd acted on, by action.", ["action"], registry=r
        )
        self.last_pass = Gauge(
            "kvgate_tierd_last_pass_timestamp_seconds",
            "When the last pass this tierd ran ended (Unix time).",
            registry=r,
        )
        self.nas_bytes = Gauge(
            "kvgate_tierd_nas_bytes", "Bytes of KV pages on the NAS, per the ledger.", registry=r
        )
        self.object_bytes = Gauge(
            "kvgate_tierd_object_bytes",
            "Bytes of KV pages in the object store, per the ledger.",
            registry=r,
        )
        limits = Gauge(
            "kvgate_tierd_limit_bytes",
            "The configured limits (0: none): nas_high and nas_low watermarks, object_max.",
            ["limit"],
            registry=r,
        )
        limits.labels("nas_high").set(config.nas_high_bytes)
        limits.labels("nas_low").set(config.nas_low_bytes)
        limits.labels("object_max").set(config.object_max_bytes)
        for result in ("ok", "skipped", "failed"):
            self.passes.labels(result)
        for action in ACTIONS:
            self.pages.labels(action)

    def observe(self, report: PassReport | None) -> None:
        """Account a finished pass; ``None`` for one that failed as a whole."""
        self.last_pass.set(time.time())
        if report is None:
            self.passes.labels("failed").inc()
            return
        if report.skipped:
            self.passes.labels("skipped").inc()
            return
        self.passes.labels("failed" if report.errors else "ok").inc()
        for action in ACTIONS:
            self.pages.labels(action).inc(getattr(report, action))
        self.nas_bytes.set(report.nas_bytes)
        self.object_bytes.set(report.object_bytes)
