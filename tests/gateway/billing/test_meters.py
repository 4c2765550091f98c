"""Metered usage to Stripe: hourly intervals cut where billing periods change, stable
identifiers, retries after a 500, the move from daily reports, and reconcile.

The session's recording Stripe (``stripe_account``) stands for the one Stripe account,
because reconcile checks every team with a Stripe customer in the shared database. The
reporter's clock is its ``now`` argument: tests that follow a day run it at simulated
times, as cron would, and judge the result by Stripe's rules (``tests.support.billing.invoiced``).
The commands that run the reporter are tested in ``test_billing_cli.py``.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import asyncpg

from gateway.billing import meters, subscriptions
from gateway.billing.client import stripe_client
from gateway.billing.config import BillingConfig
from gateway.billing.reconcile import reconcile
from migrations import runner
from tests.support.billing import (
    EVENT_PATH,
    LONG_AGO,
    TEAM_PRICE,
    daily_report,
    for_team,
    invoiced,
    meter_account,
    meter_config,
    metered,
    paying_team,
    quarter_hours,
    report_every,
    scratch_pool,
    subscription,
    use,
)
from tests.support.stripe_stub import RecordingStripe

_IN, _CACHED, _OUT = (name for name, _ in meters.METERS.values())
#: Stripe finalizes an invoice this long after its period ends (the account default).
_FINALIZE = timedelta(hours=1)
_INTERVAL_MIGRATION = "0008_meter_reports_by_interval.sql"


def _at(day: date, hour: int, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute, second, micro), UTC)


def _days_ago(n: int) -> date:
    return (datetime.now(UTC) - timedelta(days=n)).date()


def test_intervals_are_hours_cut_at_period_bounds_and_stamped_inside() -> None:
    day = date(2026, 3, 1)
    renewal = _at(day, 14, 37)
    pieces = meters.split(_at(day, 13, 20), _at(day, 16), {renewal, _at(day, 9)})
    assert pieces == [
        (_at(day, 13, 20), _at(day, 14)),
        (_at(day, 14), renewal),
        (renewal, _at(day, 15)),
        (_at(day, 15), _at(day, 16)),
    ]
    assert all(a <= meters.event_time(a, b) < b for a, b in pieces)
    assert (
        meters.event_time(_at(day, 14), renewal)
        < renewal
        <= meters.event_time(renewal, _at(day, 15))
    )
    # A paid period opened by a webhook 0.4 s into a second: the stamp is a whole second in
    # the same Stripe period (Stripe's bounds are whole seconds).
    opened = _at(day, 15, 0, 0, 400_000)
    assert meters.event_time(opened, _at(day, 15, 0, 1)) == _at(day, 15)
    ids = {meters.identifier(t, m, a) for t in (7, 8) for m in meters.METERS for a, _ in pieces}
    assert len(ids) == 2 * 3 * 4
    assert meters.identifier(7, "input_tokens", renewal) == "kvgate-7-input_tokens-20260301T143700Z"
    assert meters.identifier(7, "input_tokens", opened).endswith("T150000.400000Z")
    # An interval closes ten minutes after it ends, not before.
    assert (
        meters.closed_until(_at(day, 15, 9)) < _at(day, 15) <= meters.closed_until(_at(day, 15, 10))
    )


async def test_reporting_twice_for_the_same_interval_sends_identical_identifiers(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool, "team", LONG_AGO)
    now = datetime.now(UTC)
    hour = meters.hour_of(now) - timedelta(hours=5)
    await use(pg_pool, team_id, hour + timedelta(minutes=10), prompt=100, cached=40, out=7)
    await use(pg_pool, team_id, hour + timedelta(minutes=50), prompt=20, cached=0, out=3)
    await use(pg_pool, team_id, now - timedelta(minutes=1), 5, 0, 5)  # its hour is still open
    client = stripe_client(meter_config(), stripe_account)
    stripe_account.fail_next[EVENT_PATH] = 1  # Stripe answers 500 to the first try

    first = await meters.report(pg_pool, client, now)
    assert first.failed == {}
    sent = for_team(stripe_account.calls(EVENT_PATH), team_id)
    # 3 meters, the first try failed and stripe-python retried it with the same request.
    assert [c.status for c in sent] == [500, 200, 200, 200]
    assert sent[0].params == sent[1].params
    assert sent[0].headers["Idempotency-Key"] == sent[1].headers["Idempotency-Key"]
    values = {c.params["identifier"]: c.params["payload[value]"] for c in sent}
    # One event per meter for the closed hour, stamped inside it; the open hour waits.
    assert values == {
        meters.identifier(team_id, "input_tokens", hour): "80",
        meters.identifier(team_id, "cached_input_tokens", hour): "40",
        meters.identifier(team_id, "output_tokens", hour): "10",
    }
    assert all(c.params["payload[stripe_customer_id]"] == customer for c in sent)
    assert all(
        hour.timestamp() <= int(c.params["timestamp"]) < (hour + meters.HOUR).timestamp()
        for c in sent
    )

    # A second reporter that never saw the first one's acknowledgements (a crash between
    # Stripe's answer and our bookkeeping) sends the same interval again...
    await pg_pool.execute("UPDATE meter_reports SET sent_at = NULL WHERE team_id = $1", team_id)
    second = await meters.report(pg_pool, client, now)
    assert second.failed == {}
    again = for_team(stripe_account.calls(EVENT_PATH), team_id)[len(sent) :]
    # ...as identical requests under identical idempotency keys, so Stripe counts it once.
    assert sorted(c.params["identifier"] for c in again) == sorted(values)
    assert {c.headers["Idempotency-Key"] for c in again} == set(values)
    assert [c.params for c in again] == [c.params for c in sent[1:]]
    billed = {i: e.value for i, e in stripe_account.events.items() if i in values}
    assert billed == {i: int(v) for i, v in values.items()}

    # A third run finds everything acknowledged and sends nothing.
    third = await meters.report(pg_pool, client, now)
    assert not for_team(stripe_account.calls(EVENT_PATH), team_id)[len(sent) + len(again) :]
    assert third.already >= 3


async def test_reconcile_finds_an_hour_stripe_does_not_have(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, _ = await paying_team(pg_pool, "team", LONG_AGO)
    now = datetime.now(UTC)
    client = stripe_client(meter_config(), stripe_account)
    hour = meters.hour_of(now) - timedelta(hours=30)
    await use(pg_pool, team_id, hour + timedelta(minutes=20), prompt=9, cached=4, out=2)
    before = await reconcile(pg_pool, client, meter_config(), now)
    mine = [d for d in before.differences if d.team_id == team_id]
    assert {(d.meter, d.start, d.end, d.local, d.stripe) for d in mine} == {
        ("input_tokens", hour, hour + meters.HOUR, 5, 0),
        ("cached_input_tokens", hour, hour + meters.HOUR, 4, 0),
        ("output_tokens", hour, hour + meters.HOUR, 2, 0),
    }
    await meters.report(pg_pool, client, now)
    after = await reconcile(pg_pool, client, meter_config(), now)
    assert [d for d in after.differences if d.team_id == team_id] == []


async def test_reconcile_catches_usage_stamped_in_another_hour(pg_pool: asyncpg.Pool) -> None:
    account = meter_account()  # holds only what this test sends it
    team_id, _, customer = await paying_team(pg_pool, "team", LONG_AGO)
    day = _days_ago(3)
    await use(pg_pool, team_id, _at(day, 15, 30), prompt=100, cached=0, out=0)
    client = stripe_client(meter_config(), account)
    # The daily reporter's event: the day's total, stamped at noon. The day's totals agree,
    # but Stripe bills those tokens as used at noon (before a 15:00 subscription, or on the
    # invoice a 14:37 renewal closed).
    await client.v1.billing.meter_events.create_async(
        {
            "event_name": _IN,
            "identifier": f"kvgate-{team_id}-input_tokens-{day:%Y%m%d}",
            "timestamp": int(_at(day, 12).timestamp()),
            "payload": {"stripe_customer_id": customer, "value": "100"},
        }
    )
    outcome = await reconcile(pg_pool, client, meter_config(), datetime.now(UTC))
    mine = {
        (d.meter, d.start, d.local, d.stripe) for d in outcome.differences if d.team_id == team_id
    }
    assert mine == {("input_tokens", _at(day, 12), 0, 100), ("input_tokens", _at(day, 15), 100, 0)}


async def test_only_paid_usage_is_billed_and_stamped_inside_the_paid_time(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    first = _days_ago(8)
    second, third, fourth = (first + timedelta(days=n) for n in (1, 2, 3))
    # Subscribed at 15:00:00 (Stripe's time), its webhook opened the paid period 4.2 s
    # later; the cancellation's webhook closed it on the third day at 10:20.
    paid = (_at(first, 15, 0, 4, 200_000), _at(third, 10, 20))
    await pg_pool.execute(
        "INSERT INTO billing_periods (team_id, started_at, ended_at) VALUES ($1, $2, $3)",
        team_id,
        *paid,
    )
    await use(pg_pool, team_id, _at(first, 11), 1000, 0, 0)  # free: before the upgrade
    await use(pg_pool, team_id, _at(first, 15, 0, 2), 2000, 0, 0)  # free: not yet open
    await use(pg_pool, team_id, _at(first, 15, 30), 100, 10, 1)
    await use(pg_pool, team_id, _at(second, 1), 200, 20, 2)
    await use(pg_pool, team_id, _at(second, 23), 300, 30, 3)
    await use(pg_pool, team_id, _at(third, 10, 10), 400, 40, 4)
    await use(pg_pool, team_id, _at(third, 10, 30), 5000, 0, 0)  # free: after it ended
    await use(pg_pool, team_id, _at(fourth, 12), 6000, 0, 0)  # free
    result = await meters.report(
        pg_pool, stripe_client(meter_config(), stripe_account), datetime.now(UTC)
    )
    assert result.failed == {}
    assert metered(stripe_account, customer) == {_IN: 900, _CACHED: 100, _OUT: 10}
    # Every event is stamped while the subscription existed: Stripe bills none before it.
    start, end = (int(t.timestamp()) for t in paid)
    assert all(
        start <= e.timestamp < end
        for e in [e for e in stripe_account.events.values() if e.customer == customer]
    )


async def test_usage_before_a_renewal_is_billed_on_the_invoice_the_renewal_closes(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool, "team", LONG_AGO)
    day = _days_ago(2)
    renewal = _at(day, 14, 37)
    old, new = (renewal - timedelta(days=30), renewal), (renewal, renewal + timedelta(days=30))
    config = BillingConfig(prices={"team": TEAM_PRICE})
    sub_id = f"sub_{uuid.uuid4().hex[:12]}"
    sub = subscription(sub_id, customer, period=old)
    await subscriptions.apply_subscription(pg_pool, config, team_id, sub, int(old[0].timestamp()))
    for ts, tokens in ((_at(day, 9, 10), 100), (_at(day, 14, 20), 200), (_at(day, 14, 50), 400)):
        await use(pg_pool, team_id, ts, tokens, 0, tokens // 100)
    await use(pg_pool, team_id, _at(day, 20), 800, 0, 8)
    renewed: list[datetime] = []

    async def webhooks(now: datetime) -> None:
        # Stripe renews at 14:37 and says so (in the newer API's shape) a minute later.
        if now > renewal + timedelta(minutes=1) and not renewed:
            renewed.append(now)
            sub = subscription(sub_id, customer, period=new, period_on_items=True)
            await subscriptions.apply_subscription(
                pg_pool, config, team_id, sub, int(now.timestamp())
            )

    client = stripe_client(meter_config(), stripe_account)
    times = quarter_hours(_at(day, 0), _at(day, 0) + timedelta(hours=25))
    accepted = await report_every(pg_pool, client, stripe_account, times, webhooks)
    # The old period's invoice is finalized an hour after the renewal: by then it has all
    # the usage from before 14:37, and none after; the new period's has the rest.
    closes = renewal + _FINALIZE
    assert invoiced(stripe_account, accepted, customer, _IN, old, closes) == 300
    assert invoiced(stripe_account, accepted, customer, _OUT, old, closes) == 3
    assert invoiced(stripe_account, accepted, customer, _IN, new, new[1] + _FINALIZE) == 1200
    assert metered(stripe_account, customer) == {_IN: 1500, _OUT: 15}
    bounds = await pg_pool.fetchrow(
        "SELECT current_period_start, current_period_end FROM stripe_subscriptions "
        "WHERE subscription_id = $1",
        sub_id,
    )
    assert tuple(bounds) == new


async def test_the_hours_before_a_cancellation_reach_its_final_invoice(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    day = _days_ago(2)
    cancelled = _at(day, 14, 37, 20, 500_000)  # the webhook closed the paid period then
    await pg_pool.execute(
        "INSERT INTO billing_periods (team_id, started_at, ended_at) VALUES ($1, $2, $3)",
        team_id,
        LONG_AGO,
        cancelled,
    )
    await use(pg_pool, team_id, _at(day, 14, 10), 50, 0, 1)
    await use(pg_pool, team_id, _at(day, 14, 30), 60, 0, 1)
    await use(pg_pool, team_id, _at(day, 14, 50), 7000, 0, 70)  # on the free plan
    client = stripe_client(meter_config(), stripe_account)
    times = quarter_hours(_at(day, 12), _at(day, 12) + timedelta(hours=13))
    accepted = await report_every(pg_pool, client, stripe_account, times)
    # Stripe makes the final invoice at the cancellation and finalizes it within the hour.
    final = (LONG_AGO, cancelled)
    assert invoiced(stripe_account, accepted, customer, _IN, final, cancelled + _FINALIZE) == 110
    assert metered(stripe_account, customer) == {_IN: 110, _OUT: 2}


async def test_two_reporters_at_once_plan_each_interval_once(
    pg_pool: asyncpg.Pool, stripe_account: RecordingStripe
) -> None:
    team_id, _, customer = await paying_team(pg_pool, "team", LONG_AGO)
    now = datetime.now(UTC)
    await use(pg_pool, team_id, meters.hour_of(now) - timedelta(minutes=150), 70, 0, 7)
    client = stripe_client(meter_config(), stripe_account)
    results = await asyncio.gather(*(meters.report(pg_pool, client, now) for _ in range(2)))
    assert [r.failed for r in results] == [{}, {}]
    rows = await pg_pool.fetch("SELECT meter FROM meter_reports WHERE team_id = $1", team_id)
    assert sorted(r["meter"] for r in rows) == ["input_tokens", "output_tokens"]
    assert metered(stripe_account, customer) == {_IN: 70, _OUT: 7}


async def test_days_reported_before_the_move_to_hours_are_never_sent_again(
    pg_dsn: str, tmp_path: Path
) -> None:
    pool = await scratch_pool(pg_dsn)
    try:
        for path in runner.MIGRATIONS_DIR.glob("*.sql"):
            if path.name != _INTERVAL_MIGRATION:
                shutil.copy(path, tmp_path)
        async with pool.acquire() as conn:
            await runner.migrate(conn, tmp_path)
        team_id = await pool.fetchval(
            "INSERT INTO teams (name, plan, cache_salt) VALUES ('old', 'team', 's') RETURNING id"
        )
        customer = "cus_test_daily_scheme"
        await pool.execute("INSERT INTO stripe_customers VALUES ($1, $2)", team_id, customer)
        await pool.execute(
            "INSERT INTO billing_periods (team_id, started_at) VALUES ($1, $2)", team_id, LONG_AGO
        )
        sent_day, unsent_day, open_day, last_day = (_days_ago(n) for n in (4, 3, 2, 1))
        await use(pool, team_id, _at(sent_day, 10), 100, 10, 1)
        await use(pool, team_id, _at(unsent_day, 11), 200, 20, 2)
        await use(pool, team_id, _at(open_day, 13), 400, 40, 4)
        await use(pool, team_id, _at(open_day, 13, 40), 800, 80, 8)
        await use(pool, team_id, _at(last_day, 9), 1600, 160, 16)
        account = meter_account()
        client = stripe_client(meter_config(), account)
        # The daily reporter's last run, on open_day: it sent sent_day, and wrote unsent_day
        # but crashed (or Stripe was down) before Stripe acknowledged it.
        await daily_report(pool, client, team_id, customer, sent_day, (90, 10, 1), sent=True)
        await daily_report(pool, client, team_id, customer, unsent_day, (180, 20, 2), sent=False)
        before = len(account.calls(EVENT_PATH))
        shutil.copy(runner.MIGRATIONS_DIR / _INTERVAL_MIGRATION, tmp_path)
        async with pool.acquire() as conn:
            assert await runner.migrate(conn, tmp_path) == [_INTERVAL_MIGRATION]

        now = datetime.now(UTC)
        assert (await meters.report(pool, client, now)).failed == {}
        sent = {c.params["identifier"]: c.params for c in account.calls(EVENT_PATH)[before:]}
        # The unsent day goes out exactly as the daily reporter would have sent it; the sent
        # day is not sent again in any form; the rest goes out by the hour.
        noon = str(int(_at(unsent_day, 12).timestamp()))
        assert {
            i: (p["timestamp"], p["payload[value]"]) for i, p in sent.items() if "T" not in i
        } == {
            f"kvgate-{team_id}-input_tokens-{unsent_day:%Y%m%d}": (noon, "180"),
            f"kvgate-{team_id}-cached_input_tokens-{unsent_day:%Y%m%d}": (noon, "20"),
            f"kvgate-{team_id}-output_tokens-{unsent_day:%Y%m%d}": (noon, "2"),
        }
        hours = (_at(open_day, 13), _at(last_day, 9))
        assert {i for i in sent if "T" in i} == {
            meters.identifier(team_id, m, h) for m in meters.METERS for h in hours
        }
        assert metered(account, customer) == {_IN: 2790, _CACHED: 310, _OUT: 31}
        # Reconcile compares the old whole days as days, the rest by the hour: all agree.
        outcome = await reconcile(pool, client, meter_config(), now)
        assert outcome.differences == []
    finally:
        await pool.close()


async def test_the_oldest_unreported_paid_usage_is_what_the_lag_metric_reads(
    pg_dsn: str, stripe_account: RecordingStripe
) -> None:
    """``kvgate_billing_unreported_seconds``: paid usage not yet with Stripe ages until a
    report sends it; free usage never counts."""
    pool = await scratch_pool(pg_dsn)
    try:
        async with pool.acquire() as conn:
            await runner.migrate(conn)
        # a quarter to the hour: the last 20 minutes lie in an hour that is still open
        now = meters.hour_of(datetime.now(UTC)) - timedelta(minutes=15)
        assert await meters.unreported_seconds(pool, now) == 0.0
        team_id, _, _ = await paying_team(pool, paid_since=now - timedelta(hours=5))
        free_id, _, _ = await paying_team(pool)  # a customer without a paid period
        await use(pool, free_id, now - timedelta(hours=9), 100, 0, 1)
        await use(pool, team_id, now - timedelta(hours=3), 100, 10, 1)
        await use(pool, team_id, now - timedelta(minutes=20), 100, 10, 1)
        assert await meters.unreported_seconds(pool, now) == 3 * 3600
        client = stripe_client(meter_config(), stripe_account)
        assert (await meters.report(pool, client, now)).failed == {}
        # the closed hours went out; the last 20 minutes wait for their hour to close
        assert await meters.unreported_seconds(pool, now) == 20 * 60
    finally:
        await pool.close()
