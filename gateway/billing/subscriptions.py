"""What a team may do, from what Stripe says about its subscriptions and invoices.

Everything lands in ``teams.plan``: the gateway reads the plan with every key lookup (cached
for a couple of seconds), so a change here reaches the rate limits of every replica within
that cache time. A failed payment does not cut a team off at once: it enters a grace
period with its paid limits, and only when that runs out does it drop to ``free``.

Stripe delivers webhooks in any order and redelivers old ones, so nothing here trusts
arrival order. Each subscription row keeps the ``created`` time of the last event applied
to it (older ones are ignored, and an ended subscription is never revived); each team keeps
the ``created`` time of the newest subscription or invoice event applied for it
(``stripe_customers.event_created``), and an invoice event older than that is stale news
and is ignored. The team's plan is always computed from all its live subscriptions, so
ending one of two does not drop a team that still pays through the other.

Each subscription row also keeps the bounds of its current billing period, where Stripe
switches from one invoice to the next: the metered usage reporter cuts its intervals there.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from gateway.billing.config import BillingConfig

log = logging.getLogger(__name__)

FREE_PLAN = "free"
#: Subscription statuses under which the paid plan applies in full.
_PAYING = {"active", "trialing"}
#: Statuses under which a subscription still gives the team a paid plan (past_due: in grace).
LIVE = ("active", "trialing", "past_due")
#: Statuses after which nothing more will be paid: back to free.
_ENDED = {"canceled", "unpaid", "incomplete_expired", "paused"}
#: Statuses Stripe never moves a subscription out of: a row in one is never overwritten.
_FINAL = ("canceled", "incomplete_expired")


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


async def live_subscription(db: Any, team_id: int) -> str | None:
    """The status of ``team_id``'s live subscription (the best one if several), or None.

    Live means Stripe may still charge for it: active, trialing or past_due.
    """
    best = await _best_live(db, team_id, with_plan=False)
    return None if best is None else str(best["status"])


async def apply_subscription(
    db: Any, config: BillingConfig, team_id: int, sub: dict[str, Any], event_created: int
) -> None:
    """Bring ``team_id``'s plan and billing state in line with subscription object ``sub``.

    Events can arrive out of order; one older than the last applied for this
    subscription is ignored, and an ended subscription (deleted, canceled, expired) is
    never brought back by a late event, because Stripe never revives one.
    """
    prices, plan = _prices_and_plan(config, sub)
    status = str(sub.get("status", ""))
    period_start, period_end = current_period(config, sub)
    latest = await _latest_event(db, team_id)
    newer = await db.fetchval(
        """
        INSERT INTO stripe_subscriptions (subscription_id, team_id, status, price_id, plan,
                                          event_created, current_period_start,
                                          current_period_end)
        VALUES ($1, $2, $3, $4, $5, $6, $8, $9)
        ON CONFLICT (subscription_id) DO UPDATE SET
            status = excluded.status, price_id = excluded.price_id, plan = excluded.plan,
            event_created = excluded.event_created, updated_at = now(),
            current_period_start = coalesce(excluded.current_period_start,
                                            stripe_subscriptions.current_period_start),
            current_period_end = coalesce(excluded.current_period_end,
                                          stripe_subscriptions.current_period_end)
        WHERE stripe_subscriptions.event_created <= excluded.event_created
          AND stripe_subscriptions.status <> ALL($7::text[])
        RETURNING 1
        """,
        sub["id"],
        team_id,
        status,
        ",".join(prices),
        plan,
        event_created,
        list(_FINAL),
        period_start,
        period_end,
    )
    if newer is None:
        log.info("ignored an older event for subscription %s", sub["id"])
        return
    await _record_event(db, team_id, event_created)
    if status in LIVE and plan is None:
        log.warning(
            "subscription %s has no price mapped to a plan (prices %s); set "
            "KVGATE_STRIPE_PRICES so it maps to one",
            sub["id"],
            prices,
        )
        return
    if status in LIVE or status in _ENDED:
        await _settle(db, config, team_id, fresh=event_created >= latest)


async def end_subscription(
    db: Any, config: BillingConfig, team_id: int, sub: dict[str, Any], event_created: int
) -> None:
    """The subscription is gone: record a tombstone, then settle the team's plan.

    The tombstone is an upsert, so a deletion that overtakes the subscription's
    ``created``/``updated`` events still leaves a ``canceled`` row that those older events
    cannot overwrite. The team keeps a paid plan while another of its subscriptions is
    live; otherwise it drops to free.
    """
    prices, plan = _prices_and_plan(config, sub)
    period_start, period_end = current_period(config, sub)
    latest = await _latest_event(db, team_id)
    await db.execute(
        """
        INSERT INTO stripe_subscriptions (subscription_id, team_id, status, price_id, plan,
                                          event_created, current_period_start,
                                          current_period_end)
        VALUES ($1, $2, 'canceled', $3, $4, $5, $6, $7)
        ON CONFLICT (subscription_id) DO UPDATE SET
            status = 'canceled', updated_at = now(),
            event_created = greatest(stripe_subscriptions.event_created, excluded.event_created),
            current_period_start = coalesce(excluded.current_period_start,
                                            stripe_subscriptions.current_period_start),
            current_period_end = coalesce(excluded.current_period_end,
                                          stripe_subscriptions.current_period_end)
        """,
        sub["id"],
        team_id,
        ",".join(prices),
        plan,
        event_created,
        period_start,
        period_end,
    )
    await _record_event(db, team_id, event_created)
    await _settle(db, config, team_id, fresh=event_created >= latest)


async def invoice_paid(db: Any, team_id: int, event_created: int) -> None:
    """An invoice was paid: leave grace, and restore the plan if grace had run out.

    Ignored when a newer invoice or subscription event was already applied for the team.
    """
    if event_created < await _latest_event(db, team_id):
        log.info("ignored an invoice.paid older than team %d's latest billing event", team_id)
        return
    await _record_event(db, team_id, event_created)
    best = await _best_live(db, team_id)
    if best is not None:
        await _set(db, team_id, str(best["plan"]), "active")
    else:
        await db.execute(
            "UPDATE stripe_customers SET state = 'active', grace_until = NULL WHERE team_id = $1",
            team_id,
        )


async def invoice_failed(db: Any, config: BillingConfig, team_id: int, event_created: int) -> None:
    """A payment failed: start the grace period, unless the news is already out of date.

    A failure older than an ``invoice.paid`` or a subscription event already applied for
    the team (a late or redelivered webhook) must not put a paying team into grace.
    """
    if event_created < await _latest_event(db, team_id):
        log.info("ignored an invoice.payment_failed older than team %d's latest event", team_id)
        return
    await _record_event(db, team_id, event_created)
    await start_grace(db, config, team_id)


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


def current_period(
    config: BillingConfig, sub: dict[str, Any]
) -> tuple[datetime | None, datetime | None]:
    """The bounds of ``sub``'s current billing period, or (None, None) if it names none.

    The metered usage reporter cuts its intervals there (``gateway.billing.meters``), so
    usage is stamped into the invoice of the period it was used in. Before Stripe API
    version 2025-03-31 the bounds are on the subscription; since then on each item, and the
    metered items' are the ones that decide where usage is billed.
    """
    items = (sub.get("items") or {}).get("data") or []
    metered = [i for i in items if (i.get("price") or {}).get("id") in config.metered_prices]
    for holder in (sub, *metered, *items):
        start, end = holder.get("current_period_start"), holder.get("current_period_end")
        if isinstance(start, int) and isinstance(end, int):
            return datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    return None, None


def _prices_and_plan(config: BillingConfig, sub: dict[str, Any]) -> tuple[list[str], str | None]:
    """The price ids of ``sub``'s items and the first plan one of them sells."""
    items = (sub.get("items") or {}).get("data") or []
    prices = [str((item.get("price") or {}).get("id", "")) for item in items]
    plans = [p for p in (config.plan_for_price(price) for price in prices) if p is not None]
    return prices, plans[0] if plans else None


async def _latest_event(db: Any, team_id: int) -> int:
    """Stripe's ``created`` of the newest event applied for the team (0 if none).

    Every handler calls this first: it locks the team's ``stripe_customers`` row, so
    concurrent webhooks for one team apply one after the other and always take their
    locks in the same order (team, then subscription).
    """
    found = await db.fetchval(
        "SELECT event_created FROM stripe_customers WHERE team_id = $1 FOR UPDATE", team_id
    )
    return int(found or 0)


async def _record_event(db: Any, team_id: int, event_created: int) -> None:
    """Note that an event created at ``event_created`` was applied for the team."""
    await db.execute(
        "UPDATE stripe_customers SET event_created = greatest(event_created, $2) "
        "WHERE team_id = $1",
        team_id,
        event_created,
    )


async def _best_live(db: Any, team_id: int, *, with_plan: bool = True) -> Any:
    """The team's best live subscription (with a known plan, unless ``with_plan`` is
    False), as a (status, plan) record.

    Paying (active, trialing) comes before past_due, then the newest; None if there is none.
    """
    planned = "AND plan IS NOT NULL " if with_plan else ""
    return await db.fetchrow(
        "SELECT status, plan FROM stripe_subscriptions WHERE team_id = $1 "
        f"{planned}AND status = ANY($2::text[]) "
        "ORDER BY status = 'past_due', event_created DESC LIMIT 1",
        team_id,
        list(LIVE),
    )


async def _settle(db: Any, config: BillingConfig, team_id: int, *, fresh: bool) -> None:
    """Set the team's plan from its live subscriptions after one of them changed.

    A paying subscription gives its plan; only past_due ones left means grace; none left
    means free. ``fresh`` is False for an event older than the team's newest billing event:
    such an event may still grant or end a plan, but a stale past_due must not start a
    grace period that a newer payment already settled.
    """
    best = await _best_live(db, team_id)
    if best is None:
        await _set(db, team_id, FREE_PLAN, "lapsed")
    elif best["status"] in _PAYING:
        await _set(db, team_id, str(best["plan"]), "active")
    elif fresh:
        await start_grace(db, config, team_id)


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
