"""What a team may do, from what Stripe says about its subscription.

Everything lands in ``teams.plan``: the gateway reads the plan with every key lookup (cached
for a couple of seconds), so a change here reaches the rate limits of every replica within
that cache time. A failed payment does not cut a team off at once: it enters a grace
period with its paid limits, and only when that runs out does it drop to ``free``.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.billing.config import BillingConfig

log = logging.getLogger(__name__)

FREE_PLAN = "free"
#: Subscription statuses under which the paid plan applies in full.
_PAYING = {"active", "trialing"}
#: Statuses after which nothing more will be paid: back to free.
_ENDED = {"canceled", "unpaid", "incomplete_expired", "paused"}


async def link_customer(db: Any, team_id: int, customer: str) -> None:
    """Remember that Stripe customer ``customer`` pays for ``team_id``."""
    await db.execute(
        "INSERT INTO stripe_customers (team_id, customer_id) VALUES ($1, $2) "
        "ON CONFLICT (team_id) DO UPDATE SET customer_id = excluded.customer_id",
        team_id,
        customer,
    )


async def team_of(db: Any, customer: str | None, metadata: dict[str, Any] | None) -> int | None:
    """The team paying through ``customer`` (or named in the object's metadata)."""
    if customer:
        found = await db.fetchval(
            "SELECT team_id FROM stripe_customers WHERE customer_id = $1", customer
        )
        if found is not None:
            return int(found)
    ref = (metadata or {}).get("team_id")
    if isinstance(ref, str) and ref.isdigit():
        team_id = int(ref)
        if customer and await db.fetchval("SELECT 1 FROM teams WHERE id = $1", team_id):
            await link_customer(db, team_id, customer)
            return team_id
    return None


async def apply_subscription(
    db: Any, config: BillingConfig, team_id: int, sub: dict[str, Any], event_created: int
) -> None:
    """Bring ``team_id``'s plan and billing state in line with subscription object ``sub``.

    Events can arrive out of order; one older than the last applied for this
    subscription is ignored.
    """
    items = (sub.get("items") or {}).get("data") or []
    prices = [str((item.get("price") or {}).get("id", "")) for item in items]
    plans = [p for p in (config.plan_for_price(price) for price in prices) if p is not None]
    plan = plans[0] if plans else None
    status = str(sub.get("status", ""))
    newer = await db.fetchval(
        """
        INSERT INTO stripe_subscriptions (subscription_id, team_id, status, price_id, plan,
                                          event_created)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (subscription_id) DO UPDATE SET
            status = excluded.status, price_id = excluded.price_id, plan = excluded.plan,
            event_created = excluded.event_created, updated_at = now()
        WHERE stripe_subscriptions.event_created <= excluded.event_created
        RETURNING 1
        """,
        sub["id"],
        team_id,
        status,
        ",".join(prices),
        plan,
        event_created,
    )
    if newer is None:
        log.info("ignored an older event for subscription %s", sub["id"])
        return
    if status in _PAYING:
        if plan is None:
            log.warning(
                "subscription %s has no price mapped to a plan (prices %s); set "
                "KVGATE_STRIPE_PRICES so it maps to one",
                sub["id"],
                prices,
            )
            return
        await _set(db, team_id, plan, "active")
    elif status == "past_due":
        await start_grace(db, config, team_id)
    elif status in _ENDED:
        await _set(db, team_id, FREE_PLAN, "lapsed")


async def end_subscription(db: Any, team_id: int, subscription_id: str, event_created: int) -> None:
    """The subscription is gone: the team drops to the free plan."""
    await db.execute(
        "UPDATE stripe_subscriptions SET status = 'canceled', event_created = $2, "
        "updated_at = now() WHERE subscription_id = $1",
        subscription_id,
        event_created,
    )
    await _set(db, team_id, FREE_PLAN, "lapsed")


async def paid(db: Any, team_id: int) -> None:
    """An invoice was paid: leave grace, and restore the plan if grace had run out."""
    plan = await db.fetchval(
        "SELECT plan FROM stripe_subscriptions WHERE team_id = $1 AND plan IS NOT NULL "
        "AND status IN ('active', 'trialing', 'past_due') ORDER BY updated_at DESC LIMIT 1",
        team_id,
    )
    if plan is not None:
        await _set(db, team_id, str(plan), "active")
    else:
        await db.execute(
            "UPDATE stripe_customers SET state = 'active', grace_until = NULL WHERE team_id = $1",
            team_id,
        )


async def start_grace(db: Any, config: BillingConfig, team_id: int) -> None:
    """A payment failed: keep the plan for ``grace_days`` (the first failure starts the clock)."""
    await db.execute(
        """
        UPDATE stripe_customers SET state = 'grace',
            grace_until = coalesce(grace_until, now() + make_interval(secs => $2))
        WHERE team_id = $1 AND state <> 'lapsed'
        """,
        team_id,
        config.grace_days * 86400,
    )


async def expire_grace(db: Any) -> list[int]:
    """Move every team whose grace period has run out to the free plan; their ids."""
    rows = await db.fetch(
        """
        WITH lapsed AS (
            UPDATE stripe_customers SET state = 'lapsed'
            WHERE state = 'grace' AND grace_until <= now() RETURNING team_id
        ), closed AS (
            UPDATE billing_periods b SET ended_at = now() FROM lapsed l
            WHERE b.team_id = l.team_id AND b.ended_at IS NULL
        )
        UPDATE teams t SET plan = $1 FROM lapsed l WHERE t.id = l.team_id RETURNING t.id
        """,
        FREE_PLAN,
    )
    return [r[0] for r in rows]


async def _set(db: Any, team_id: int, plan: str, state: str) -> None:
    await db.execute("UPDATE teams SET plan = $2 WHERE id = $1", team_id, plan)
    await db.execute(
        "UPDATE stripe_customers SET state = $2, grace_until = NULL WHERE team_id = $1",
        team_id,
        state,
    )
    # Metered usage is billed only while a period is open (see gateway.billing.meters).
    if state == "active":
        await db.execute(
            "INSERT INTO billing_periods (team_id) VALUES ($1) "
            "ON CONFLICT (team_id) WHERE ended_at IS NULL DO NOTHING",
            team_id,
        )
    else:
        await db.execute(
            "UPDATE billing_periods SET ended_at = now() WHERE team_id = $1 AND ended_at IS NULL",
            team_id,
        )
