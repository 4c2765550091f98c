"""Starting payments: the team's Stripe customer, Checkout sessions and the customer portal.

Nothing here changes a plan: that happens only when Stripe confirms it through a signed
webhook (``gateway.billing.webhooks``), so a closed tab or a forged redirect changes nothing.
"""

from __future__ import annotations

from typing import Any

import stripe

from gateway.billing import subscriptions
from gateway.billing.config import BillingConfig


class CheckoutError(ValueError):
    """A checkout cannot be started; the message says why."""


class AlreadySubscribed(CheckoutError):
    """The team already has a live subscription; a second one would bill it twice.

    Changing or cancelling the plan goes through the Stripe customer portal instead.
    """


async def customer_id(
    db: Any, client: stripe.StripeClient, team_id: int, team_name: str, email: str
) -> str:
    """The Stripe customer of ``team_id``, created on first use.

    The idempotency key makes two concurrent first clicks create one customer.
    """
    found = await db.fetchval(
        "SELECT customer_id FROM stripe_customers WHERE team_id = $1", team_id
    )
    if found is not None:
        return str(found)
    customer = await client.v1.customers.create_async(
        {"name": team_name, "email": email, "metadata": {"team_id": str(team_id)}},
        {"idempotency_key": f"kvgate-customer-{team_id}"},
    )
    await db.execute(
        "INSERT INTO stripe_customers (team_id, customer_id) VALUES ($1, $2) "
        "ON CONFLICT (team_id) DO NOTHING",
        team_id,
        customer.id,
    )
    return str(
        await db.fetchval("SELECT customer_id FROM stripe_customers WHERE team_id = $1", team_id)
    )


async def checkout_url(
    db: Any,
    client: stripe.StripeClient,
    config: BillingConfig,
    *,
    team_id: int,
    team_name: str,
    email: str,
    plan: str,
    return_url: str,
) -> str:
    """The URL of a Stripe Checkout page subscribing ``team_id`` to ``plan``.

    Raises :class:`AlreadySubscribed` while the team has a live (active, trialing or
    past_due) subscription: a second one would charge the team twice, and ending either
    would have to leave the other in force.
    """
    price = config.prices.get(plan)
    if price is None:
        raise CheckoutError(f"Plan {plan!r} cannot be bought online; contact sales.")
    status = await subscriptions.live_subscription(db, team_id)
    if status is not None:
        raise AlreadySubscribed(
            f"This team already has a subscription ({status}). To change or cancel the plan, "
            "or to update the card, use “Manage billing” (the Stripe billing portal)."
        )
    customer = await customer_id(db, client, team_id, team_name, email)
    team_ref = {"team_id": str(team_id)}
    session = await client.v1.checkout.sessions.create_async(
        {
            "mode": "subscription",
            "customer": customer,
            "client_reference_id": str(team_id),
            "line_items": [
                {"price": price, "quantity": 1},
                *({"price": p} for p in config.metered_prices),
            ],
            "subscription_data": {"metadata": team_ref},
            "metadata": {**team_ref, "plan": plan},
            "success_url": f"{return_url}?checkout=done",
            "cancel_url": f"{return_url}?checkout=cancelled",
        }
    )
    if not session.url:
        raise CheckoutError("Stripe returned a checkout session without a URL; try again.")
    return session.url


async def portal_url(
    db: Any,
    client: stripe.StripeClient,
    *,
    team_id: int,
    team_name: str,
    email: str,
    return_url: str,
) -> str:
    """The URL of the Stripe customer portal for ``team_id`` (cards, invoices, cancel)."""
    customer = await customer_id(db, client, team_id, team_name, email)
    session = await client.v1.billing_portal.sessions.create_async(
        {"customer": customer, "return_url": return_url}
    )
    return session.url
