"""Console usage by tier: cached input per day split by the tier it came back from, through
the usage recorder into Postgres and out on the page and in the CSV, and what it saved at the
configured prices (checked by hand)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import pytest

from gateway.billing.config import BillingConfig, TokenPrices
from gateway.usage import TIER_COLUMNS, UsageRecorder, UsageRow
from tests.support.accounts import accounts_app, browser, sign_up

PRICES = TokenPrices(input=Decimal("3"), cached_input=Decimal("0.5"), output=Decimal("9"))


def _row(team_id: int, ts: datetime, prompt: int, cached: int, **tiers: int) -> UsageRow:
    return UsageRow(
        request_id=f"tiers-{uuid.uuid4().hex}",
        ts=ts,
        team_id=team_id,
        key_id=None,
        client_ip=None,
        subject=f"team:{team_id}",
        model="tiny",
        worker="w1",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=5,
        reserved_tokens=0,
        ttft_ms=5.0,
        latency_ms=20.0,
        status=200,
        **{TIER_COLUMNS[tier]: n for tier, n in tiers.items()},
    )


async def test_usage_shows_cached_input_by_tier_per_day_and_what_it_saved(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool, billing=BillingConfig(token_prices=PRICES))
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        team = account.team_id
        now = datetime.now(UTC)
        recorder = UsageRecorder(pg_pool, flush_s=60, buffer_max=100)
        recorder.record(_row(team, now, 1000, 900, device=100, nas=800))
        recorder.record(_row(team, now, 600, 500, host=200, object=300))
        recorder.record(_row(team, now, 50, 0))
        await recorder.flush()
        # a day from before tiers were recorded: the roll-up has cached tokens, no tiers
        yesterday = (now - timedelta(days=1)).date()
        await pg_pool.execute(
            "INSERT INTO usage_daily (day, team_id, model, requests, prompt_tokens, "
            "cached_tokens, completion_tokens) VALUES ($1, $2, 'old', 1, 400, 400, 1)",
            yesterday,
            team,
        )
        page = await client.get(f"/console/teams/{team}/usage?days=7")
        csv = await client.get(f"/console/teams/{team}/usage.csv?days=7")
    assert page.status_code == 200
    html = page.text
    table = re.search(r'<table id="cached-by-tier">(.*?)</table>', html, re.S)
    assert table is not None
    rows = re.findall(r"<tr><td>([\d-]+)</td>(.*?)</tr>", table.group(1))
    cells = {day: re.findall(r"<td[^>]*>([^<]*)</td>", rest) for day, rest in rows}
    # GPU, host RAM, NAS, object store, tier not recorded, saved
    # today: 1400 cached tokens saved (3 - 0.5) $/M each = $0.0035
    assert cells[now.date().isoformat()] == ["100", "200", "800", "300", "0", "$0.0035"]
    # yesterday: 400 cached tokens of no recorded tier: $0.0010
    assert cells[yesterday.isoformat()] == ["0", "0", "0", "0", "400", "$0.0010"]
    # the period: 1800 cached tokens x $2.50/M = $0.0045
    assert re.search(r'id="saved">In these 7 days the cache saved <strong>\$0.0045</strong>', html)
    assert "$0.50 per million tokens instead of\n  $3.00" in html
    assert html.count("<svg") == 3 and "Cached input tokens per day, by tier" in html
    lines = csv.text.strip().splitlines()
    assert lines[0].endswith(
        "cached_device_tokens,cached_host_tokens,cached_nas_tokens,cached_object_tokens"
    )
    assert f"{now.date().isoformat()},tiny,3,250,1400,15,100,200,800,300" in lines
