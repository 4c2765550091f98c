"""The Stripe webhook endpoint: verify the signature, then apply each event exactly once.

The event id is recorded in the same transaction that applies the event, so a redelivered
event (Stripe retries until it sees a 2xx, and may send one twice) is acknowledged without
being applied again, and an event whose processing failed is not recorded and can be
retried. A bad signature is a 400 before the body is parsed, and so is a body that is not
UTF-8 (Stripe only sends UTF-8 JSON). Events may arrive in any order:
``gateway.billing.subscriptions`` orders them by Stripe's ``created`` time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson
import stripe
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.billing import subscriptions
from gateway.billing.config import BillingConfig

log = logging.getLogger(__name__)

#: Signed timestamps older than this are refused (replay protection; Stripe's default).
TOLERANCE_S = 300


async def apply_event(db: asyncpg.Connection, config: BillingConfig, event: dict[str, Any]) -> bool:
    """Apply ``event`` unless it was applied before; True when it was applied now.

    ``db`` must be a connection inside a transaction.
    """
    first = await db.fetchval(
        "INSERT INTO stripe_events (event_id, type) VALUES ($1, $2) "
        "ON CONFLICT (event_id) DO NOTHING RETURNING 1",
        event["id"],
        event["type"],
    )
    if first is None:
        return False
    kind, obj = event["type"], event["data"]["object"]
    created = int(event.get("created", 0))
    customer = obj.get("customer")
    if kind == "checkout.session.completed":
        ref = obj.get("client_reference_id") or (obj.get("metadata") or {}).get("team_id")
        if customer and isinstance(ref, str) and ref.isdigit():
            await subscriptions.link_customer(db, int(ref), customer)
        return True
    team_id = await subscriptions.team_of(db, customer, obj.get("metadata"))
    if team_id is None:
        log.warning("Stripe event %s (%s) names no team we know; ignored", event["id"], kind)
        return True
    if kind in ("customer.subscription.created", "customer.subscription.updated"):
        await subscriptions.apply_subscription(db, config, team_id, obj, created)
    elif kind == "customer.subscription.deleted":
        await subscriptions.end_subscription(db, config, team_id, obj, created)
    elif kind == "invoice.paid":
        await subscriptions.invoice_paid(db, team_id, created)
    elif kind == "invoice.payment_failed":
        await subscriptions.invoice_failed(db, config, team_id, created)
    await subscriptions.expire_grace(db)
    return True


class WebhookEndpoint:
    """``POST /billing/stripe/webhook``."""

    def __init__(self, config: BillingConfig, pool: Callable[[], asyncpg.Pool]) -> None:
        self._config = config
        self._pool = pool

    async def handle(self, request: Request) -> Response:
        payload = await request.body()
        if not self._config.webhook_secret:
            return JSONResponse(
                {"error": "Webhooks are disabled: set KVGATE_STRIPE_WEBHOOK_SECRET."}, 400
            )
        try:
            stripe.WebhookSignature.verify_header(
                payload,
                request.headers.get("stripe-signature"),
                self._config.webhook_secret,
                TOLERANCE_S,
            )
            event = orjson.loads(payload)
        except stripe.SignatureVerificationError as exc:
            return JSONResponse({"error": f"Invalid Stripe signature: {exc.user_message}"}, 400)
        except UnicodeDecodeError:
            # stripe-python decodes the body before checking the signature; Stripe always
            # sends UTF-8 JSON, so anything else is not from Stripe (or was mangled).
            return JSONResponse(
                {"error": "Body is not valid UTF-8; Stripe sends events as UTF-8 JSON."}, 400
            )
        except orjson.JSONDecodeError:
            event = None
        if not _is_event(event):
            return JSONResponse({"error": "Body is not a Stripe event."}, 400)
        async with self._pool().acquire() as conn, conn.transaction():
            applied = await apply_event(conn, self._config, event)
        return JSONResponse({"received": True, "duplicate": not applied, "id": event["id"]})


def _is_event(event: Any) -> bool:
    return (
        isinstance(event, dict)
        and isinstance(event.get("id"), str)
        and isinstance(event.get("type"), str)
        and isinstance((event.get("data") or {}).get("object"), dict)
    )
