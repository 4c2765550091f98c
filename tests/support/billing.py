"""Helpers for the billing tests: signed Stripe events and teams with a Stripe customer."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import stripe

from gateway import accounts
from gateway.billing import meters
from gateway.billing.config import BillingConfig
from gateway.console.routes import WEBHOOK_PATH
from gateway.usage import UsageRecorder, UsageRow
from tests.support.accounts import accounts_app
from tests.support.stripe_stub import Recorded, RecordingStripe

WEBHOOK_SECRET = "whsec_test"
TEAM_PRICE = "price_team_monthly"
#: Billing that takes webhooks signed with :data:`WEBHOOK_SECRET` and sells the team plan.
WEBHOOK_BILLING = BillingConfig(webhook_secret=WEBHOOK_SECRET, prices={"team": TEAM_PRICE})
#: The test account's Stripe meter ids, by the name of our meter.
METER_IDS = {
    "input_tokens": "mtr_test_input",
    "cached_input_tokens": "mtr_test_cached",
    "output_tokens": "mtr_test_output",
}
#: Stripe's path for meter events (what the recording stub files those calls under).
EVENT_PATH = "/v1/billing/meter_events"
#: Start of the test teams' paid subscriptions: before any day the billing tests use.
LONG_AGO = datetime.now(UTC) - timedelta(days=60)


def meter_account() -> RecordingStripe:
    """A fresh recording Stripe account that has our three meters."""
    return RecordingStripe(meters={METER_IDS[m]: name for m, (name, _) in meters.METERS.items()})


def meter_config() -> BillingConfig:
    """Billing that reports to the meters of :func:`meter_account`."""
    return BillingConfig(secret_key="sk_test_kvgate", meter_ids=METER_IDS)


def for_team(calls: list[Recorded], team_id: int) -> list[Recorded]:
    """The meter events among ``calls`` that carry ``team_id``'s usage."""
    return [c for c in calls if c.params["identifier"].startswith(f"kvgate-{team_id}-")]


def event(kind: str, obj: dict[str, Any], created: int | None = None) -> dict[str, Any]:
    """A Stripe event envelope of ``kind`` around ``obj`` (Stripe's v1 snapshot shape)."""
    return {
        "id": f"evt_test_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "api_version": "2025-01-27.acacia",
        "created": created if created is not None else int(time.time()),
        "livemode": False,
        "pending_webhooks": 1,
        "type": kind,
        "data": {"object": obj},
    }


def subscription(
    sub_id: str,
    customer: str,
    status: str = "active",
    price: str = TEAM_PRICE,
    period: tuple[datetime, datetime] | None = None,
    period_on_items: bool = False,
) -> dict[str, Any]:
    """A subscription object with one licensed price.

    ``period`` is its current billing period: on the subscription, as Stripe API versions
    before 2025-03-31 put it, or with ``period_on_items`` on its item, as later ones do.
    """
    item: dict[str, Any] = {
        "id": f"si_{sub_id}",
        "object": "subscription_item",
        "price": {"id": price},
    }
    sub: dict[str, Any] = {
        "id": sub_id,
        "object": "subscription",
        "customer": customer,
        "status": status,
        "metadata": {},
        "items": {"object": "list", "data": [item]},
    }
    if period is not None:
        bounds = {
            "current_period_start": int(period[0].timestamp()),
            "current_period_end": int(period[1].timestamp()),
        }
        (item if period_on_items else sub).update(bounds)
    return sub


def signed(body: dict[str, Any], secret: str = WEBHOOK_SECRET) -> tuple[bytes, dict[str, str]]:
    """``body`` as Stripe sends it, with a signature made by stripe-python's own helper."""
    payload = json.dumps(body)
    header = stripe.WebhookSignature.generate_signature_header(payload, secret)
    return payload.encode(), {"stripe-signature": header, "content-type": "application/json"}


@contextlib.asynccontextmanager
async def webhook_client(
    pool: asyncpg.Pool, billing: BillingConfig = WEBHOOK_BILLING
) -> AsyncIterator[httpx.AsyncClient]:
    """A client on the real console app (whose routes include the Stripe webhook) over
    ``pool``, billing as ``billing`` says."""
    app, _ = accounts_app(pool, billing=billing)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        yield client


async def deliver(client: httpx.AsyncClient, *events: dict[str, Any]) -> None:
    """POST each of ``events``, signed, to the webhook on ``client``, in the order given."""
    for evt in events:
        body, headers = signed(evt)
        response = await client.post(WEBHOOK_PATH, content=body, headers=headers)
        assert response.status_code == 200, response.text


def invoice(customer: str, subscription_id: str) -> dict[str, Any]:
    """An invoice object of ``subscription_id`` (the fields the webhook reads)."""
    return {
        "id": f"in_{uuid.uuid4().hex[:10]}",
        "object": "invoice",
        "customer": customer,
        "subscription": subscription_id,
    }


async def paying_team(
    pool: asyncpg.Pool, plan: str = "free", paid_since: datetime | None = None
) -> tuple[int, str, str]:
    """A team on ``plan`` with a key and a Stripe customer: (team id, key secret, customer).

    With ``paid_since`` the team has been on a paid subscription since then (its usage
    from then on is billable).
    """
    team = await accounts.create_team(pool, f"team-{uuid.uuid4().hex[:10]}", plan)
    _, secret = await accounts.create_key(pool, team.name)
    customer = f"cus_test_{uuid.uuid4().hex[:14]}"
    await pool.execute(
        "INSERT INTO stripe_customers (team_id, customer_id) VALUES ($1, $2)", team.id, customer
    )
    if paid_since is not None:
        await pool.execute(
            "INSERT INTO billing_periods (team_id, started_at) VALUES ($1, $2)", team.id, paid_since
        )
    return team.id, secret, customer


async def use(
    pool: asyncpg.Pool, team_id: int, ts: datetime, prompt: int, cached: int, out: int
) -> None:
    """One request's usage at ``ts``, written by the gateway's own recorder."""
    recorder = UsageRecorder(pool, flush_s=60, buffer_max=10)
    recorder.record(
        UsageRow(
            f"req-{uuid.uuid4().hex}", ts, team_id, None, None, f"team:{team_id}", "tiny", "w",
            prompt, cached, out, 0, 3.0, 9.0, 200,
        )
    )  # fmt: skip
    await recorder.flush()


def quarter_hours(start: datetime, end: datetime) -> list[datetime]:
    """Every 15 minutes from ``start`` through ``end``: the reporter's schedule."""
    step = timedelta(minutes=15)
    return [start + k * step for k in range(int((end - start) / step) + 1)]


async def report_every(
    pool: asyncpg.Pool,
    client: stripe.StripeClient,
    account: RecordingStripe,
    times: Iterable[datetime],
    before: Callable[[datetime], Awaitable[None]] | None = None,
) -> dict[str, datetime]:
    """Run the reporter at each of ``times`` (a simulated clock), as cron would.

    ``before(now)`` runs ahead of each round (webhooks arriving meanwhile). Returns, per
    meter event Stripe accepted during these rounds, the simulated time of the round that
    sent it.
    """
    earlier = set(account.events)
    accepted: dict[str, datetime] = {}
    for now in times:
        if before is not None:
            await before(now)
        result = await meters.report(pool, client, now)
        assert result.failed == {}, result.failed
        for ident in account.events.keys() - earlier:
            accepted.setdefault(ident, now)
    return accepted


def metered(account: RecordingStripe, customer: str) -> dict[str, int]:
    """What Stripe holds for ``customer``: the total of each meter's events."""
    totals: Counter[str] = Counter()
    for e in account.events.values():
        if e.customer == customer:
            totals[e.event_name] += e.value
    return dict(totals)


def invoiced(
    account: RecordingStripe,
    accepted: dict[str, datetime],
    customer: str,
    event_name: str,
    period: tuple[datetime, datetime],
    finalized: datetime,
) -> int:
    """What the invoice of ``period`` bills on one meter, by Stripe's rules.

    Stripe counts an event on the invoice of the billing period holding its timestamp, and
    only if it arrived before that invoice was finalized.
    """
    start, end = (int(t.timestamp()) for t in period)
    return sum(
        e.value
        for ident, e in account.events.items()
        if e.customer == customer
        and e.event_name == event_name
        and start <= e.timestamp < end
        and ident in accepted
        and accepted[ident] < finalized
    )


async def daily_report(
    pool: asyncpg.Pool,
    client: stripe.StripeClient,
    team_id: int,
    customer: str,
    day: date,
    values: tuple[int, int, int],
    *,
    sent: bool,
) -> None:
    """What the daily reporter (before migration 0008) did for one team and day.

    It wrote one ``meter_reports`` row per meter, with ``values`` in ``METERS`` order, and
    when ``sent`` had Stripe accept the day as one event per meter stamped at noon.
    """
    noon = datetime.combine(day, datetime.min.time(), UTC) + timedelta(hours=12)
    for (meter, (event_name, _)), value in zip(meters.METERS.items(), values, strict=True):
        ident = f"kvgate-{team_id}-{meter}-{day:%Y%m%d}"
        await pool.execute(
            "INSERT INTO meter_reports (identifier, team_id, meter, day, value, sent_at) "
            "VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN now() END)",
            ident, team_id, meter, day, value, sent,
        )  # fmt: skip
        if sent:
            await client.v1.billing.meter_events.create_async(
                {
                    "event_name": event_name,
                    "identifier": ident,
                    "timestamp": int(noon.timestamp()),
                    "payload": {"stripe_customer_id": customer, "value": str(value)},
                },
                {"idempotency_key": ident},
            )


async def scratch_pool(pg_dsn: str) -> asyncpg.Pool:
    """A pool on a new, empty database of the session server (for migrating from scratch)."""
    name = f"billing_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(pg_dsn, database=name, min_size=1, max_size=4)
    assert pool is not None
    return pool
