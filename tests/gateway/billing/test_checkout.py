"""Upgrading from the console: Stripe Checkout and the customer portal, through the stub."""

from __future__ import annotations

import time
import uuid

import asyncpg
import pytest

from gateway.billing.config import BillingConfig
from tests.support.accounts import accounts_app, browser, form_token, sign_up
from tests.support.billing import TEAM_PRICE, WEBHOOK_SECRET, deliver, event, subscription
from tests.support.stripe_stub import RecordingStripe

BILLING = BillingConfig(
    secret_key="sk_test_kvgate",
    webhook_secret=WEBHOOK_SECRET,
    prices={"team": TEAM_PRICE},
    metered_prices=("price_input", "price_cached", "price_output"),
)


async def test_upgrade_opens_checkout_for_the_team_and_manage_opens_the_portal(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    stub = RecordingStripe()
    app, _ = accounts_app(pg_pool, stub, billing=BILLING)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/billing"
        shown = await client.get(page)
        assert shown.status_code == 200 and "Upgrade" in shown.text and "$49.00" in shown.text
        token = await form_token(client, page)
        go = await client.post(page + "/checkout", data={"csrf_token": token, "plan": "team"})
        assert go.status_code == 303
        assert go.headers["location"].startswith("https://checkout.stripe.com/c/pay/cs_test_")
        (customer_call,) = stub.calls("/v1/customers")
        assert customer_call.params["metadata[team_id]"] == str(account.team_id)
        assert customer_call.headers["Idempotency-Key"] == f"kvgate-customer-{account.team_id}"
        (session,) = stub.calls("/v1/checkout/sessions")
        assert session.params["mode"] == "subscription"
        assert session.params["client_reference_id"] == str(account.team_id)
        assert session.params["line_items[0][price]"] == TEAM_PRICE
        assert session.params["line_items[0][quantity]"] == "1"
        assert [session.params[f"line_items[{i}][price]"] for i in (1, 2, 3)] == [
            "price_input",
            "price_cached",
            "price_output",
        ]
        assert session.params["subscription_data[metadata][team_id]"] == str(account.team_id)
        assert session.params["success_url"].startswith(f"http://console.test{page}")
        # Nothing changes until Stripe's signed webhook says so.
        plan = await pg_pool.fetchval("SELECT plan FROM teams WHERE id = $1", account.team_id)
        assert plan == "free"

        portal = await client.post(page + "/portal", data={"csrf_token": token})
        assert portal.status_code == 303
        assert portal.headers["location"].startswith("https://billing.stripe.com/p/session/")
        (portal_call,) = stub.calls("/v1/billing_portal/sessions")
        customer = await pg_pool.fetchval(
            "SELECT customer_id FROM stripe_customers WHERE team_id = $1", account.team_id
        )
        assert portal_call.params["customer"] == customer == session.params["customer"]
        assert len(stub.calls("/v1/customers")) == 1  # the customer was made once


async def test_unknown_plan_and_missing_stripe_are_explained(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    stub = RecordingStripe()
    app, _ = accounts_app(pg_pool, stub, billing=BILLING)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/billing"
        token = await form_token(client, page)
        bad = await client.post(page + "/checkout", data={"csrf_token": token, "plan": "gold"})
        assert bad.status_code == 400 and "cannot be bought online" in bad.text
    assert stub.calls("/v1/checkout/sessions") == []
    bare, _ = accounts_app(pg_pool)  # no Stripe key configured
    async with browser(bare) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/billing"
        token = await form_token(client, page)
        off = await client.post(page + "/checkout", data={"csrf_token": token, "plan": "team"})
        assert off.status_code == 400 and "not set up" in off.text


async def test_a_team_with_a_live_subscription_is_sent_to_the_portal_not_checkout(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    stub = RecordingStripe()
    app, _ = accounts_app(pg_pool, stub, billing=BILLING)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/billing"
        token = await form_token(client, page)
        first = await client.post(page + "/checkout", data={"csrf_token": token, "plan": "team"})
        assert first.status_code == 303
        customer = await pg_pool.fetchval(
            "SELECT customer_id FROM stripe_customers WHERE team_id = $1", account.team_id
        )
        sub_id, now = f"sub_{uuid.uuid4().hex[:12]}", int(time.time())
        for status in ("active", "trialing", "past_due"):
            await deliver(
                client,
                event(
                    "customer.subscription.updated",
                    subscription(sub_id, customer, status),
                    now,
                ),
            )
            shown = await client.get(page)
            assert "<button>Upgrade</button>" not in shown.text
            assert "Manage billing" in shown.text
            again = await client.post(
                page + "/checkout", data={"csrf_token": token, "plan": "team"}
            )
            assert again.status_code == 409, again.text
            assert "already has a subscription" in again.text and "Manage billing" in again.text
        assert len(stub.calls("/v1/checkout/sessions")) == 1  # no second subscription started
        # Once it has ended, the team may subscribe again.
        await deliver(
            client,
            event(
                "customer.subscription.deleted",
                subscription(sub_id, customer, "canceled"),
                now + 1,
            ),
        )
        shown = await client.get(page)
        assert "<button>Upgrade</button>" in shown.text
        anew = await client.post(page + "/checkout", data={"csrf_token": token, "plan": "team"})
        assert anew.status_code == 303
        assert len(stub.calls("/v1/checkout/sessions")) == 2
