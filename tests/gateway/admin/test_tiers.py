"""/admin/workers pieces: reading the workers' tier metrics as the worker exports them,
the line charts, and the page itself over registered workers and the ledger."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.admin import worker_metrics
from gateway.pages.charts import Line, line_chart
from tests.support.gateway import deregister, register_workers, unique
from tests.support.site import site_app, staff_account
from tiering.tiers.base import TierStats
from workers.tier_metrics import TierCollector


def _exported() -> str:
    """A /metrics page as the worker writes it (its own collector, real registry)."""
    registry = CollectorRegistry()
    snapshot = {
        "tiers": {
            "host": TierStats("host", hits=30, misses=10, used_bytes=4096, items=2),
            "nas": TierStats("nas", hits=5, misses=5, bytes_written=65536, corruptions=1),
        },
        "store": {"writes": 3},
        "failures": {"nas.write": 2, "object.read": 1},
        "write_queue": 7,
    }
    registry.register(TierCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def test_parse_reads_the_tier_figures_the_worker_exports() -> None:
    scrape = worker_metrics.parse(_exported())
    host, nas = scrape.tiers["host"], scrape.tiers["nas"]
    assert (host.used_bytes, host.items, host.hits, host.misses) == (4096, 2, 30, 10)
    assert host.hit_rate == 0.75
    assert (nas.bytes_written, nas.corruptions, nas.failures) == (65536, 1, 2)
    assert scrape.tiers["object"].failures == 1
    assert scrape.gauges["tier_write_queue_pages"] == 7
    assert worker_metrics.TierFigures("x").hit_rate is None


def test_line_chart_draws_a_line_per_series_with_gaps_left_out() -> None:
    now = datetime.now(UTC)
    times = [now - timedelta(minutes=m) for m in (2, 1, 0)]
    svg = line_chart(
        "Bytes <per> tier",
        times,
        [Line("host", "s-plan-0", [1.0, None, 3.0]), Line("nas", "s-plan-1", [None] * 3)],
        lambda v: f"{v:.0f}",
    )
    assert svg.count("<polyline") == 1
    points = svg.split('points="')[1].split('"')[0].split()
    assert len(points) == 2
    assert "Bytes &lt;per&gt; tier" in svg and ">nas<" in svg  # legend even without data
    assert "<svg" in line_chart("empty", [], [], str)


async def test_workers_page_shows_registry_health_ledger_tiers_and_samples(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    alive, gone = unique("w-admin"), unique("w-admin-gone")
    # Nothing listens on port 9 (discard): its scrape fails and the page says so.
    await register_workers(
        pg_pool, "m-admin", {alive: "http://127.0.0.1:9", gone: "http://127.0.0.1:9"}
    )
    await pg_pool.execute(
        "UPDATE workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_id = $1", gone
    )
    key = hashlib.sha256(uuid.uuid4().bytes).digest()
    await pg_pool.execute(
        "INSERT INTO kv_ledger (key, namespace, size, tiers) VALUES ($1, $2, 8192, 3)",
        key,
        hashlib.sha256(b"ns").digest(),
    )
    stale = unique("w-stale")
    await pg_pool.execute(
        "INSERT INTO tier_samples VALUES (now() - interval '8 days', $1, 'host', 1, 1, 0, 0, 0)",
        stale,
    )
    try:
        app = site_app(pg_pool)
        staff = await staff_account(pg_pool, app, caplog)
        html = (await staff.client.get("/admin/workers")).text
    finally:
        await deregister(pg_pool, [alive, gone])
    assert alive in html and gone in html and "m-admin" in html
    assert "metrics: ConnectError" in html
    nas_row = html[html.index('<tr data-tier="nas"', html.index('id="ledger"')) :]
    assert int(nas_row.split('data-bytes="')[1].split('"')[0]) >= 8192
    assert html.count('<svg class="chart"') == 2
    sampled = await pg_pool.fetchval(
        "SELECT count(*) FROM tier_samples WHERE worker_id = '(ledger)' AND tier = 'nas'"
    )
    assert sampled >= 1
    # Samples past the keeping time are gone.
    assert not await pg_pool.fetchval(
        "SELECT count(*) FROM tier_samples WHERE worker_id = $1", stale
    )
