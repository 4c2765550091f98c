"""Helpers for the billing tests: signed Stripe events and teams with a Stripe customer."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import stripe

from gateway import accounts
from gateway.web.routes import WEBHOOK_PATH

WEBHOOK_SECRET = "whsec_test"
TEAM_PRICE = "price_team_monthly"


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
    sub_id: str, customer: str, status: str = "active", price: str = TEAM_PRICE
) -> dict[str, Any]:
    """A subscription object with one licensed price."""
    return {
        "id": sub_id,
        "object": "subscription",
        "customer": customer,
        "status": status,
        "metadata": {},
        "items": {
            "object": "list",
            "data": [{"id": f"si_{sub_id}", "object": "subscription_item", "price": {"id": price}}],
        },
    }


def signed(body: dict[str, Any], secret: str = WEBHOOK_SECRET) -> tuple[bytes, dict[str, str]]:
    """``body`` as Stripe sends it, with a signature made by stripe-python's own helper."""
    payload = json.dumps(body)
    header = stripe.WebhookSignature.generate_signature_header(payload, secret)
    return payload.encode(), {"stripe-signature": header, "content-type": "application/json"}


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
