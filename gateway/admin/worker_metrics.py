"""Reading the workers' ``/metrics``: per-tier bytes, pages, hits, misses and failures.

The names are those of :mod:`protocol.metric_names` (``kvgate_worker_tier_<field>``,
labelled by tier); the gateway reads them over HTTP like any Prometheus scraper, so it
needs nothing from the ``workers`` package.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from protocol.metric_names import TIER_FIGURES, TIER_PREFIX, WORKER_PREFIX


@dataclass
class TierFigures:
    """One tier's figures on one worker (counters are totals since the worker started).

    ``used_bytes``/``items`` are what the worker holds itself (host RAM); the shared tiers'
    contents are the ledger's to say, so for them ``bytes_written`` is the worker's part.
    """

    tier: str
    used_bytes: int = 0
    items: int = 0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    corruptions: int = 0
    failures: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups; None before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


@dataclass
class Scrape:
    """What one worker's /metrics said, or why it could not be read."""

    tiers: dict[str, TierFigures] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    error: str = ""


def parse(text: str) -> Scrape:
    """Tier figures and plain gauges (queue, running, pool use) from a metrics page."""
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_sum", "_count")):
                continue
            tier = sample.labels.get("tier")
            if tier is not None and sample.name.startswith(TIER_PREFIX):
                figures = out.tiers.setdefault(tier, TierFigures(tier))
                field = _FIELDS.get(sample.name.removeprefix(TIER_PREFIX))
                if field is not None:
                    setattr(figures, field, getattr(figures, field) + int(sample.value))
            elif not sample.labels and family.name.startswith(WORKER_PREFIX):
                out.gauges[family.name.removeprefix(WORKER_PREFIX)] = sample.value
    return out


#: metric name after the tier prefix -> the figure of :class:`TierFigures` it adds to
_FIELDS = {
    name: field
    for field, name in (TIER_FIGURES | {"failures": "failures_total"}).items()
    if field in TierFigures.__dataclass_fields__
}


async def scrape(client: httpx.AsyncClient, url: str) -> Scrape:
    """``url``/metrics parsed; a scrape with ``error`` set when the worker did not answer."""
    try:
        response = await client.get(url.rstrip("/") + "/metrics")
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return Scrape(error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return parse(response.text)


async def scrape_all(urls: list[str], timeout_s: float) -> list[Scrape]:
    """Every worker's scrape, concurrently, each bounded by ``timeout_s``."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return list(await asyncio.gather(*(scrape(client, u) for u in urls)))
