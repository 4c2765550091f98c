"""/admin/workers: the worker registry with health, load and model, and the KV tiers.

Per tier it shows what the ledger holds (the shared NAS and object tiers: bytes, pages,
hits) and what each worker's /metrics reports (every tier including VRAM-side host RAM:
bytes, pages, hit rate, failures). Each view also stores one sample per worker, tier and
minute in ``tier_samples``; the charts over time are drawn from those samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from gateway.admin import worker_metrics
from gateway.admin.worker_metrics import Scrape, TierFigures
from gateway.pages.charts import Line, line_chart
from gateway.pages.kit import PageKit
from gateway.pages.sessions import SessionUser
from gateway.public.config import SiteConfig
from protocol.tiers import LEDGER_BITS

#: The pseudo worker id of samples taken from the ledger.
LEDGER = "(ledger)"
CHART_HOURS = 6
#: Samples older than this are deleted as new ones are written.
KEEP_DAYS = 7


@dataclass(frozen=True)
class WorkerRow:
    """A registered worker, its heartbeat age and what its /metrics said."""

    worker_id: str
    url: str
    model: str
    capacity: int
    load: int
    started_at: datetime
    heartbeat_age_s: float
    healthy: bool
    scrape: Scrape


@dataclass(frozen=True)
class LedgerTier:
    """What the ledger records for one shared tier."""

    tier: str
    pages: int
    bytes: int
    hits: int


_PER_TIER = (
    "count(*) FILTER (WHERE tiers & {bit} <> 0), "
    "coalesce(sum(size) FILTER (WHERE tiers & {bit} <> 0), 0), "
    "coalesce(sum(hits) FILTER (WHERE tiers & {bit} <> 0), 0)"
)
_LEDGER_SQL = (
    "SELECT "
    + ", ".join(_PER_TIER.format(bit=bit) for bit in LEDGER_BITS.values())
    + " FROM kv_ledger"
)


async def ledger_tiers(db: Any) -> list[LedgerTier]:
    """Pages, bytes and hits per shared tier, from the KV ledger in one scan."""
    row = await db.fetchrow(_LEDGER_SQL)
    return [
        LedgerTier(tier, row[3 * i], int(row[3 * i + 1]), int(row[3 * i + 2]))
        for i, tier in enumerate(LEDGER_BITS)
    ]


async def _record(db: Any, workers: list[WorkerRow], ledger: list[LedgerTier]) -> None:
    rows = [
        (w.worker_id, t.tier, t.used_bytes, t.items, t.hits, t.misses, t.failures + t.corruptions)
        for w in workers
        for t in w.scrape.tiers.values()
    ]
    rows += [(LEDGER, t.tier, t.bytes, t.pages, t.hits, 0, 0) for t in ledger]
    await db.execute(
        "DELETE FROM tier_samples WHERE minute < now() - make_interval(days => $1)", KEEP_DAYS
    )
    await db.executemany(
        "INSERT INTO tier_samples VALUES (date_trunc('minute', now()), $1, $2, $3, $4, $5, $6, $7) "
        "ON CONFLICT DO NOTHING",
        rows,
    )


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


async def charts(db: Any) -> list[Markup]:
    """Bytes per tier (workers' own figures summed, and the ledger's) and hit rate per
    tier over the last hours, from the samples."""
    rows = await db.fetch(
        """
        SELECT minute, tier, worker_id = $2 AS ledger, sum(used_bytes)::float8,
               sum(hits)::float8, sum(misses)::float8
        FROM tier_samples WHERE minute > now() - make_interval(hours => $1)
        GROUP BY 1, 2, 3 ORDER BY 1
        """,
        CHART_HOURS,
        LEDGER,
    )
    times = sorted({r[0] for r in rows})
    at = {t: i for i, t in enumerate(times)}
    sizes: dict[str, list[float | None]] = {}
    rates: dict[str, list[float | None]] = {}
    for minute, tier, from_ledger, used, hits, misses in rows:
        label = f"{tier} (ledger)" if from_ledger else tier
        sizes.setdefault(label, [None] * len(times))[at[minute]] = float(used)
        if not from_ledger and hits + misses:
            rates.setdefault(tier, [None] * len(times))[at[minute]] = hits / (hits + misses)
    css = {name: f"s-plan-{i % 6}" for i, name in enumerate(sorted({*sizes, *rates}))}
    return [
        line_chart(
            "Bytes per tier",
            times,
            [Line(k, css[k], v) for k, v in sorted(sizes.items())],
            _bytes,
        ),
        line_chart(
            "Hit rate per tier (since each worker started)",
            times,
            [Line(k, css[k], v) for k, v in sorted(rates.items())],
            lambda v: f"{v:.0%}",
        ),
    ]


class TierViews:
    """The workers-and-tiers page (called with the signed-in staff user)."""

    def __init__(self, site: PageKit, config: SiteConfig, worker_timeout_s: float) -> None:
        self.site = site
        self.config = config
        self.worker_timeout_s = worker_timeout_s

    async def workers(self) -> list[WorkerRow]:
        """Every registered worker with a fresh scrape of its /metrics."""
        rows = await self.site.db.fetch(
            "SELECT worker_id, url, model, capacity, load, started_at, "
            "extract(epoch FROM now() - heartbeat_at)::float8 FROM workers ORDER BY worker_id"
        )
        scrapes = await worker_metrics.scrape_all(
            [r["url"] for r in rows], self.config.metrics_timeout_s
        )
        return [
            WorkerRow(*r, r[6] <= self.worker_timeout_s and not s.error, s)
            for r, s in zip(rows, scrapes, strict=True)
        ]

    async def page(self, request: Request, user: SessionUser) -> Response:
        """Registry, per-tier figures, recent errors and charts over time."""
        workers = await self.workers()
        ledger = await ledger_tiers(self.site.db)
        await _record(self.site.db, workers, ledger)
        totals: dict[str, TierFigures] = {}
        for w in workers:
            for t in w.scrape.tiers.values():
                total = totals.setdefault(t.tier, TierFigures(t.tier))
                for name in vars(total):
                    if name != "tier":
                        setattr(total, name, getattr(total, name) + getattr(t, name))
        errors = await self.site.db.fetch(
            """
            SELECT worker_id, tier, max(failures) - min(failures) AS recent
            FROM tier_samples WHERE minute > now() - interval '1 hour' AND worker_id <> $1
            GROUP BY 1, 2 HAVING max(failures) > min(failures) ORDER BY 3 DESC
            """,
            LEDGER,
        )
        return self.site.render(
            request,
            "admin/workers.html",
            user=user,
            workers=workers,
            ledger=ledger,
            totals=sorted(totals.values(), key=lambda t: t.tier),
            errors=errors,
            charts=await charts(self.site.db),
            human=_bytes,
        )
