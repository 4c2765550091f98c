"""``kvgate billing report`` and ``kvgate billing reconcile``: retried runs that reconcile
to zero, reporting rounds that never send an hour twice and outlive a Stripe outage, and
settings that are refused with a message naming what to set.

The commands run against the session's recording Stripe (``stripe_account``), the same
account every other billing test reports to, since reconcile checks every paying team in
the shared database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from gateway.billing import meters
from gateway.billing.config import BillingConfig
from kvgate.cli.billing import billing
from tests.support.billing import EVENT_PATH, LONG_AGO, METER_IDS, for_team, paying_team, use
from tests.support.stripe_stub import RecordingStripe


@pytest.fixture
def billing_env(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.setenv("KVGATE_STRIPE_SECRET_KEY", "sk_test_kvgate")
    monkeypatch.setenv("KVGATE_STRIPE_METER_IDS", json.dumps(METER_IDS))
    yield


def _closed(days_ago: int) -> datetime:
    """Half past the hour ``days_ago`` days back: long closed."""
    return meters.hour_of(datetime.now(UTC) - timedelta(days=days_ago)) + timedelta(minutes=30)


def _team_with_usage(pg_dsn: str, days_ago: int, prompt: int, cached: int, out: int) -> int:
    """A paying team with usage on all three meters ``days_ago`` days back."""

    async def setup() -> int:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            team_id, _, _ = await paying_team(pool, "team", LONG_AGO)
            await use(pool, team_id, _closed(days_ago), prompt=prompt, cached=cached, out=out)
            return team_id
        finally:
            await pool.close()

    return asyncio.run(setup())


def test_kvgate_billing_reconcile_reports_zero_difference_after_retried_run(
    pg_dsn: str, stripe_account: RecordingStripe, billing_env: None
) -> None:
    team_id = _team_with_usage(pg_dsn, days_ago=1, prompt=1000, cached=600, out=250)
    stripe_account.fail_next[EVENT_PATH] = 1
    runner = CliRunner()
    obj = {"stripe_http_client": stripe_account}
    before = len(stripe_account.calls(EVENT_PATH))
    reported = runner.invoke(billing, ["report"], obj=obj)
    assert reported.exit_code == 0, reported.output
    run = stripe_account.calls(EVENT_PATH)[before:]
    (failed,) = [c for c in run if c.status == 500]
    assert [c.status for c in run if c.params == failed.params] == [500, 200]
    assert len(for_team(run, team_id)) >= 3
    checked = runner.invoke(billing, ["reconcile"], obj=obj)
    assert checked.exit_code == 0, checked.output
    assert ": 0 differences" in checked.output

    # Usage Stripe never heard of shows up as a difference, with a non-zero exit.
    async def late() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
        try:
            await use(pool, team_id, _closed(1), prompt=10, cached=0, out=0)
        finally:
            await pool.close()

    asyncio.run(late())
    differs = runner.invoke(billing, ["reconcile"], obj=obj)
    assert differs.exit_code == 1
    assert ": 1 differences" in differs.output
    assert f"{team_id}\t" in differs.output and "input_tokens" in differs.output


def test_reconcile_names_the_missing_meter_setting(
    billing_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVGATE_STRIPE_METER_IDS")
    result = CliRunner().invoke(
        billing, ["reconcile"], obj={"stripe_http_client": RecordingStripe()}
    )
    assert result.exit_code == 1 and "KVGATE_STRIPE_METER_IDS" in result.output


def test_report_every_keeps_reporting_and_never_sends_an_hour_twice(
    pg_dsn: str, stripe_account: RecordingStripe, billing_env: None
) -> None:
    team_id = _team_with_usage(pg_dsn, days_ago=2, prompt=900, cached=300, out=120)
    before = len(stripe_account.calls(EVENT_PATH))
    obj = {"stripe_http_client": stripe_account}
    args = ["report", "--every", "0.0001", "--rounds", "2"]
    result = CliRunner().invoke(billing, args, obj=obj)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("billing: reporting every 0.0001 minutes\n")
    rounds = [line for line in result.output.splitlines() if line.startswith("sent ")]
    assert len(rounds) == 2
    assert "0 failed" in rounds[0] and rounds[1].startswith("sent 0 meter events")
    mine = for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
    assert sorted(c.params["identifier"].split("-")[2] for c in mine) == [
        "cached_input_tokens",
        "input_tokens",
        "output_tokens",
    ]


def test_report_every_outlives_a_stripe_outage_and_the_next_run_sends_it(
    pg_dsn: str, stripe_account: RecordingStripe, billing_env: None
) -> None:
    team_id = _team_with_usage(pg_dsn, days_ago=2, prompt=900, cached=300, out=120)
    before = len(stripe_account.calls(EVENT_PATH))
    obj = {"stripe_http_client": stripe_account}
    stripe_account.fail_next[EVENT_PATH] = 10_000
    try:
        args = ["report", "--every", "0.0001", "--rounds", "2"]
        down = CliRunner().invoke(billing, args, obj=obj)
    finally:
        stripe_account.fail_next[EVENT_PATH] = 0
    assert down.exit_code == 1
    assert "the last round left usage unsent" in down.output
    # both rounds tried every one of the team's meters (each with stripe-python's retries)
    tried = for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
    assert {c.status for c in tried} == {500}
    assert len({c.params["identifier"] for c in tried}) == 3
    assert len(tried) == 2 * 3 * (1 + BillingConfig().max_network_retries)
    before = len(stripe_account.calls(EVENT_PATH))
    up = CliRunner().invoke(billing, ["report"], obj=obj)
    assert up.exit_code == 0, up.output
    sent = for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
    assert len(sent) == 3 and {c.status for c in sent} == {200}


def test_rounds_without_every_is_refused_before_anything_is_sent(billing_env: None) -> None:
    result = CliRunner().invoke(
        billing, ["report", "--rounds", "2"], obj={"stripe_http_client": RecordingStripe()}
    )
    assert result.exit_code == 2 and "give --every too" in result.output
