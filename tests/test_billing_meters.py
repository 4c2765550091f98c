"""Metered usage to Stripe: stable identifiers, retries after a 500, and reconcile.

One recording Stripe stands for the Stripe account of this whole module, because
reconcile checks every team with a Stripe customer in the shared database.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

import asyncpg
import pytest
from billing_support import paying_team
from click.testing import CliRunner
from stripe_stub import Recorded, RecordingStripe

from gateway.billing import meters
from gateway.billing.client import stripe_client
from gateway.billing.config import BillingConfig
from gateway.billing.reconcile import reconcile
from gateway.usage import UsageRecorder, UsageRow
from kvgate.cmd_billing import billing

METER_IDS = {
    "input_tokens": "mtr_test_input",
    "cached_input_tokens": "mtr_test_cached",
    "output_tokens": "mtr_test_output",
}
EVENT_PATH = "/v1/billing/meter_events"
#: Start of the test teams' paid subscriptions: before any day these tests use.
_LONG_AGO = datetime.now(UTC) - timedelta(days=60)


@pytest.fixture(scope="module")
def stripe_account() -> RecordingStripe:
    return RecordingStripe(meters={METER_IDS[m]: name for m, (name, _) in meters.METERS.items()})


def _config() -> BillingConfig:
    return BillingConfig(secret_key="sk_test_kvgate", meter_ids=METER_IDS)


async def _use(
    pool: asyncpg.Pool,
    team_id: int,
    day: date,
    prompt: int,
    cached: int,
    out: int,
    at: time = time(15, 30),
) -> None:
    """One request's usage at ``at`` on ``day``, written by the gateway's own recorder."""
    recorder = UsageRecorder(pool, flush_s=60, buffer_max=10)
    ts = datetime.combine(day, at, UTC)
    recorder.record(
        UsageRow(
            f"req-{uuid.uuid4().hex}",
            ts,
            team_id,
            None,
            None,
            f"team:{team_id}",
            "tiny",
            "w",
            prompt,
            cached,
            out,
            0,
            3.0,
            9.0,
            200,
        )
    )
    await recorder.flush()


def _for_team(calls: list[Recorded], team_id: int) -> list[Recorded]:
    return [c for c in calls if c.params["identifier"].startswith(f"kvgate-{team_id}-")]


async def test_identifier_is_stable_per_team_meter_and_day() -> None:
    day = date(2026, 3, 1)
    assert meters.identifier(7, "input_tokens", day) == meters.identifier(7, "input_tokens", day)
    distinct = {
        meters.identifier(t, m, d)
        for t in (7, 8)
        for m in meters.METERS
        for d in (day, day + timedelta(days=1))
    }
    assert len(distinct) == 12
    # Days close ten minutes after midnight UTC, not before.
    assert meters.last_closed_day(datetime(2026, 3, 2, 0, 5, tzinfo=UTC)) == date(2026, 2, 28)
    assert meters.last_closed_day(datetime(2026, 3, 2, 0, 15, tzinfo=UTC)) == date(2026, 3, 1)


async def test_reporting_twice_for_the_same_period_sends_identical_identifiers(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool, "team", _LONG_AGO)
    now = datetime.now(UTC)
    day = meters.last_closed_day(now) - timedelta(days=2)
    await _use(pg_pool, team_id, day, prompt=100, cached=40, out=7)
    await _use(pg_pool, team_id, day, prompt=20, cached=0, out=3)
    await _use(pg_pool, team_id, meters.last_closed_day(now) + timedelta(days=1), 5, 0, 5)
    client = stripe_client(_config(), stripe_account)
    stripe_account.fail_next[EVENT_PATH] = 1  # Stripe answers 500 to the first try

    first = await meters.report(pg_pool, client, now)
    assert first.failed == {}
    sent = _for_team(stripe_account.calls(EVENT_PATH), team_id)
    # 3 meters, the first try failed and stripe-python retried it with the same request.
    assert [c.status for c in sent] == [500, 200, 200, 200]
    assert sent[0].params == sent[1].params
    assert sent[0].headers["Idempotency-Key"] == sent[1].headers["Idempotency-Key"]
    values = {c.params["identifier"]: c.params["payload[value]"] for c in sent}
    assert values == {
        meters.identifier(team_id, "input_tokens", day): "80",
        meters.identifier(team_id, "cached_input_tokens", day): "40",
        meters.identifier(team_id, "output_tokens", day): "10",
    }
    assert all(c.params["payload[stripe_customer_id]"] == customer for c in sent)
    # Today is open, so it was not reported.
    assert all(day.strftime("%Y%m%d") in c.params["identifier"] for c in sent)

    # A second reporter that never saw the first one's acknowledgements (a crash between
    # Stripe's answer and our bookkeeping) sends the same period again...
    await pg_pool.execute("UPDATE meter_reports SET sent_at = NULL WHERE team_id = $1", team_id)
    second = await meters.report(pg_pool, client, now)
    assert second.failed == {}
    again = _for_team(stripe_account.calls(EVENT_PATH), team_id)[len(sent) :]
    # ...under identical identifiers and idempotency keys, so Stripe counts it once.
    assert sorted(c.params["identifier"] for c in again) == sorted(values)
    assert {c.headers["Idempotency-Key"] for c in again} == set(values)
    billed = {i: e.value for i, e in stripe_account.events.items() if i in values}
    assert billed == {i: int(v) for i, v in values.items()}

    # A third run finds everything acknowledged and sends nothing.
    third = await meters.report(pg_pool, client, now)
    assert not _for_team(stripe_account.calls(EVENT_PATH), team_id)[len(sent) + len(again) :]
    assert third.already >= 3


async def test_reconcile_finds_a_day_stripe_does_not_have(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, _ = await paying_team(pg_pool, "team", _LONG_AGO)
    now = datetime.now(UTC)
    client = stripe_client(_config(), stripe_account)
    day = meters.last_closed_day(now) - timedelta(days=4)
    await _use(pg_pool, team_id, day, prompt=9, cached=4, out=2)
    before = await reconcile(pg_pool, client, _config(), now)
    mine = [d for d in before.differences if d.team_id == team_id]
    assert {(d.meter, d.day, d.local, d.stripe) for d in mine} == {
        ("input_tokens", day, 5, 0),
        ("cached_input_tokens", day, 4, 0),
        ("output_tokens", day, 2, 0),
    }
    await meters.report(pg_pool, client, now)
    after = await reconcile(pg_pool, client, _config(), now)
    assert [d for d in after.differences if d.team_id == team_id] == []


async def test_only_usage_inside_a_paid_subscription_is_billed(pg_pool: asyncpg.Pool) -> None:
    team_id, _, _ = await paying_team(pg_pool)
    first = meters.last_closed_day(datetime.now(UTC)) - timedelta(days=8)
    second, third, fourth = (first + timedelta(days=n) for n in (1, 2, 3))
    # Paid from `first` 12:00 to `third` 10:00 UTC.
    await pg_pool.execute(
        "INSERT INTO billing_periods (team_id, started_at, ended_at) VALUES ($1, $2, $3)",
        team_id,
        datetime.combine(first, time(12), UTC),
        datetime.combine(third, time(10), UTC),
    )
    await _use(pg_pool, team_id, first, 1000, 0, 0, at=time(11))  # free: before the upgrade
    await _use(pg_pool, team_id, first, 100, 10, 1, at=time(13))
    await _use(pg_pool, team_id, second, 200, 20, 2, at=time(1))
    await _use(pg_pool, team_id, second, 300, 30, 3, at=time(23))
    await _use(pg_pool, team_id, third, 400, 40, 4, at=time(9))
    await _use(pg_pool, team_id, third, 5000, 0, 0, at=time(11))  # free: after it ended
    await _use(pg_pool, team_id, fourth, 6000, 0, 0)  # free
    totals = await meters.local_totals(pg_pool, first - timedelta(days=1), fourth)
    mine = {(p.day, p.meter): p.value for p in totals if p.team_id == team_id}
    assert mine == {
        (first, "input_tokens"): 90,
        (first, "cached_input_tokens"): 10,
        (first, "output_tokens"): 1,
        (second, "input_tokens"): 450,
        (second, "cached_input_tokens"): 50,
        (second, "output_tokens"): 5,
        (third, "input_tokens"): 360,
        (third, "cached_input_tokens"): 40,
        (third, "output_tokens"): 4,
    }


@pytest.fixture
def billing_env(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.setenv("KVGATE_STRIPE_SECRET_KEY", "sk_test_kvgate")
    monkeypatch.setenv("KVGATE_STRIPE_METER_IDS", json.dumps(METER_IDS))
    yield


def _team_with_usage(pg_dsn: str, days_ago: int, prompt: int, cached: int, out: int) -> int:
    """A paying team with usage on all three meters ``days_ago`` closed days back."""

    async def setup() -> int:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            team_id, _, _ = await paying_team(pool, "team", _LONG_AGO)
            day = meters.last_closed_day(datetime.now(UTC)) - timedelta(days=days_ago)
            await _use(pool, team_id, day, prompt=prompt, cached=cached, out=out)
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
    assert len(_for_team(run, team_id)) >= 3
    checked = runner.invoke(billing, ["reconcile"], obj=obj)
    assert checked.exit_code == 0, checked.output
    assert ": 0 differences" in checked.output

    # Usage Stripe never heard of shows up as a difference, with a non-zero exit.
    async def late() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
        try:
            day = meters.last_closed_day(datetime.now(UTC)) - timedelta(days=1)
            await _use(pool, team_id, day, prompt=10, cached=0, out=0)
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


def test_report_every_keeps_reporting_and_never_sends_a_day_twice(
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
    mine = _for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
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
    tried = _for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
    assert {c.status for c in tried} == {500}
    assert len({c.params["identifier"] for c in tried}) == 3
    assert len(tried) == 2 * 3 * (1 + BillingConfig().max_network_retries)
    before = len(stripe_account.calls(EVENT_PATH))
    up = CliRunner().invoke(billing, ["report"], obj=obj)
    assert up.exit_code == 0, up.output
    sent = _for_team(stripe_account.calls(EVENT_PATH)[before:], team_id)
    assert len(sent) == 3 and {c.status for c in sent} == {200}


def test_rounds_without_every_is_refused_before_anything_is_sent(billing_env: None) -> None:
    result = CliRunner().invoke(
        billing, ["report", "--rounds", "2"], obj={"stripe_http_client": RecordingStripe()}
    )
    assert result.exit_code == 2 and "give --every too" in result.output
