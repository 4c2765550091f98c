"""Stripe events out of order: late invoices, early deletions, teams with two subscriptions.

Stripe delivers webhooks in no guaranteed order and redelivers old ones. Each test sends
signed events through the real webhook endpoint, in an order Stripe can produce, with
``created`` times saying when Stripe made them, and checks the team ends where the newest
news says it should.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from gateway.billing import subscriptions
from tests.support.billing import (
    deliver,
    event,
    invoice,
    paying_team,
    subscription,
    webhook_client,
)


@pytest.fixture
async def hook(pg_pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with webhook_client(pg_pool) as client:
        yield client


async def _team(pool: asyncpg.Pool, team_id: int) -> tuple[str, str, bool]:
    """(plan, billing state, whether a billing period is open) of ``team_id``."""
    row = await pool.fetchrow(
        "SELECT t.plan, c.state, EXISTS (SELECT 1 FROM billing_periods b "
        "WHERE b.team_id = t.id AND b.ended_at IS NULL) AS billing "
        "FROM teams t JOIN stripe_customers c ON c.team_id = t.id WHERE t.id = $1",
        team_id,
    )
    return str(row["plan"]), str(row["state"]), bool(row["billing"])


def _sub_id() -> str:
    return f"sub_{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("settled_by", ["invoice.paid", "customer.subscription.updated"])
async def test_a_late_payment_failure_does_not_put_a_paying_team_into_grace(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient, settled_by: str
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id, now = _sub_id(), int(time.time())
    bill = invoice(customer, sub_id)
    settled = (
        event("invoice.paid", bill, now - 10)
        if settled_by == "invoice.paid"
        else event("customer.subscription.updated", subscription(sub_id, customer), now - 10)
    )
    await deliver(
        hook,
        event("customer.subscription.created", subscription(sub_id, customer), now - 100),
        settled,
        # Made by Stripe before the payment went through, delivered (or redelivered) after.
        event("invoice.payment_failed", bill, now - 50),
    )
    assert await _team(pg_pool, team_id) == ("team", "active", True)
    grace = await pg_pool.fetchval(
        "SELECT grace_until FROM stripe_customers WHERE team_id = $1", team_id
    )
    assert grace is None
    assert team_id not in await subscriptions.expire_grace(pg_pool)


async def test_a_late_payment_does_not_end_a_newer_failures_grace(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id, now = _sub_id(), int(time.time())
    bill = invoice(customer, sub_id)
    await deliver(
        hook,
        event("customer.subscription.created", subscription(sub_id, customer), now - 100),
        event("invoice.payment_failed", bill, now - 10),
        event("invoice.paid", bill, now - 50),  # an older invoice's payment, delivered late
    )
    assert await _team(pg_pool, team_id) == ("team", "grace", True)


async def test_a_deletion_overtaking_the_creation_leaves_the_team_free(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id, now = _sub_id(), int(time.time())
    await deliver(
        hook,
        event("customer.subscription.deleted", subscription(sub_id, customer, "canceled"), now),
        event("customer.subscription.created", subscription(sub_id, customer), now - 30),
        event("customer.subscription.updated", subscription(sub_id, customer), now - 20),
        # Same second as the deletion: Stripe never revives a deleted subscription.
        event("customer.subscription.updated", subscription(sub_id, customer), now),
    )
    assert await _team(pg_pool, team_id) == ("free", "lapsed", False)
    row = await pg_pool.fetchrow(
        "SELECT status, event_created FROM stripe_subscriptions WHERE subscription_id = $1",
        sub_id,
    )
    assert (row["status"], row["event_created"]) == ("canceled", now)


async def test_ending_one_of_two_subscriptions_keeps_the_plan_of_the_other(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    first, second, now = _sub_id(), _sub_id(), int(time.time())
    await deliver(
        hook,
        event("customer.subscription.created", subscription(first, customer), now - 100),
        event("customer.subscription.created", subscription(second, customer), now - 90),
        event("customer.subscription.deleted", subscription(first, customer, "canceled"), now - 50),
    )
    assert await _team(pg_pool, team_id) == ("team", "active", True)
    # The last one ending (here through an update to canceled) drops the team to free.
    await deliver(
        hook,
        event("customer.subscription.updated", subscription(second, customer, "canceled"), now),
    )
    assert await _team(pg_pool, team_id) == ("free", "lapsed", False)


async def test_ending_the_paying_subscription_leaves_a_past_due_one_in_grace(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    paying, failing, now = _sub_id(), _sub_id(), int(time.time())
    await deliver(
        hook,
        event("customer.subscription.created", subscription(paying, customer), now - 100),
        event(
            "customer.subscription.updated", subscription(failing, customer, "past_due"), now - 90
        ),
    )
    assert await _team(pg_pool, team_id) == ("team", "active", True)  # one still pays
    await deliver(
        hook,
        event("customer.subscription.deleted", subscription(paying, customer, "canceled"), now),
    )
    assert await _team(pg_pool, team_id) == ("team", "grace", True)
