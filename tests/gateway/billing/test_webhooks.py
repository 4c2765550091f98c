"""The Stripe webhook: signatures, exactly-once events, plan changes reaching the gateway."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg
import httpx
import pytest
import stripe

from gateway.billing import subscriptions
from gateway.console.routes import WEBHOOK_PATH
from tests.support.billing import (
    TEAM_PRICE,
    WEBHOOK_BILLING,
    WEBHOOK_SECRET,
    event,
    paying_team,
    signed,
    subscription,
    webhook_client,
)
from tests.support.gateway import (
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    unique,
)


@pytest.fixture
async def hook(pg_pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with webhook_client(pg_pool) as client:
        yield client


async def _plan(pool: asyncpg.Pool, team_id: int) -> str:
    return str(await pool.fetchval("SELECT plan FROM teams WHERE id = $1", team_id))


async def _state(pool: asyncpg.Pool, team_id: int) -> str:
    return str(
        await pool.fetchval("SELECT state FROM stripe_customers WHERE team_id = $1", team_id)
    )


async def test_bad_signature_is_400_and_changes_nothing(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    evt = event("customer.subscription.updated", subscription("sub_bad", customer))
    body, headers = signed(evt, secret="whsec_someone_else")
    for bad in (
        headers,
        {},  # no signature at all
        {"stripe-signature": signed(evt)[1]["stripe-signature"].replace("v1=", "v1=00")},
    ):
        response = await hook.post(WEBHOOK_PATH, content=body, headers=bad)
        assert response.status_code == 400, response.text
    # A valid signature over a different body does not carry over either.
    _, good_headers = signed(evt)
    tampered = body.replace(b'"active"', b'"trialing"')
    assert (
        await hook.post(WEBHOOK_PATH, content=tampered, headers=good_headers)
    ).status_code == 400
    assert await _plan(pg_pool, team_id) == "free"
    assert (
        await pg_pool.fetchval("SELECT 1 FROM stripe_events WHERE event_id = $1", evt["id"]) is None
    )
    assert (
        await pg_pool.fetchval(
            "SELECT 1 FROM stripe_subscriptions WHERE subscription_id = 'sub_bad'"
        )
        is None
    )


async def test_a_body_that_is_not_utf8_is_400_and_changes_nothing(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    before = await pg_pool.fetchval("SELECT count(*) FROM stripe_events")
    body = b'{"id": "evt_test_\xff\xfe", "type": "invoice.paid"}'
    header = stripe.WebhookSignature.generate_signature_header("anything", WEBHOOK_SECRET)
    response = await hook.post(
        WEBHOOK_PATH,
        content=body,
        headers={"stripe-signature": header, "content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert "UTF-8" in response.json()["error"]
    assert await pg_pool.fetchval("SELECT count(*) FROM stripe_events") == before


async def test_same_event_twice_changes_state_once(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id = f"sub_{uuid.uuid4().hex[:12]}"
    now = int(time.time())
    upgrade = event("customer.subscription.updated", subscription(sub_id, customer), now - 10)
    first = await hook.post(WEBHOOK_PATH, content=(s := signed(upgrade))[0], headers=s[1])
    assert first.status_code == 200 and first.json()["duplicate"] is False
    assert await _plan(pg_pool, team_id) == "team"
    # Later the subscription ends; then Stripe redelivers the old upgrade event.
    ended = event("customer.subscription.deleted", subscription(sub_id, customer, "canceled"), now)
    body, headers = signed(ended)
    assert (await hook.post(WEBHOOK_PATH, content=body, headers=headers)).status_code == 200
    assert await _plan(pg_pool, team_id) == "free"
    again = await hook.post(WEBHOOK_PATH, content=(s := signed(upgrade))[0], headers=s[1])
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert await _plan(pg_pool, team_id) == "free"
    # One paid period, opened by the upgrade and closed by the end: billing stops there.
    periods = await pg_pool.fetch(
        "SELECT ended_at FROM billing_periods WHERE team_id = $1", team_id
    )
    assert len(periods) == 1 and periods[0]["ended_at"] is not None
    count = await pg_pool.fetchval(
        "SELECT count(*) FROM stripe_events WHERE event_id = $1", upgrade["id"]
    )
    assert count == 1


async def test_older_event_arriving_late_is_ignored(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id = f"sub_{uuid.uuid4().hex[:12]}"
    now = int(time.time())
    newer = event("customer.subscription.updated", subscription(sub_id, customer, "canceled"), now)
    older = event("customer.subscription.updated", subscription(sub_id, customer), now - 60)
    for evt in (newer, older):
        body, headers = signed(evt)
        assert (await hook.post(WEBHOOK_PATH, content=body, headers=headers)).status_code == 200
    assert await _plan(pg_pool, team_id) == "free"


async def test_checkout_completed_links_the_customer_by_team_reference(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    from gateway import accounts

    team = await accounts.create_team(pg_pool, unique("team"), "free")
    customer = f"cus_test_{uuid.uuid4().hex[:12]}"
    done = event(
        "checkout.session.completed",
        {"id": "cs_test_1", "object": "checkout.session", "customer": customer,
         "client_reference_id": str(team.id), "subscription": "sub_x", "metadata": {}},
    )  # fmt: skip
    body, headers = signed(done)
    assert (await hook.post(WEBHOOK_PATH, content=body, headers=headers)).status_code == 200
    linked = await pg_pool.fetchval(
        "SELECT team_id FROM stripe_customers WHERE customer_id = $1", customer
    )
    assert linked == team.id


async def test_failed_payment_keeps_the_plan_for_the_grace_period_then_free(
    pg_pool: asyncpg.Pool, hook: httpx.AsyncClient
) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    sub_id = f"sub_{uuid.uuid4().hex[:12]}"
    invoice = {"id": f"in_{uuid.uuid4().hex[:10]}", "object": "invoice", "customer": customer}
    for evt in (
        event("customer.subscription.created", subscription(sub_id, customer)),
        event("invoice.payment_failed", invoice),
    ):
        body, headers = signed(evt)
        assert (await hook.post(WEBHOOK_PATH, content=body, headers=headers)).status_code == 200
    assert await _plan(pg_pool, team_id) == "team"
    assert await _state(pg_pool, team_id) == "grace"
    # The grace period runs out (moved into the past rather than waited for).
    await pg_pool.execute(
        "UPDATE stripe_customers SET grace_until = now() - interval '1 second' WHERE team_id = $1",
        team_id,
    )
    assert team_id in await subscriptions.expire_grace(pg_pool)
    assert (await _plan(pg_pool, team_id), await _state(pg_pool, team_id)) == ("free", "lapsed")
    # Paying the invoice afterwards restores the plan.
    body, headers = signed(event("invoice.paid", invoice))
    assert (await hook.post(WEBHOOK_PATH, content=body, headers=headers)).status_code == 200
    assert (await _plan(pg_pool, team_id), await _state(pg_pool, team_id)) == ("team", "active")


async def test_webhooks_are_refused_without_a_configured_secret(pg_pool: asyncpg.Pool) -> None:
    team_id, _, customer = await paying_team(pg_pool)
    body, headers = signed(event("customer.subscription.updated", subscription("sub_n", customer)))
    async with webhook_client(pg_pool, replace(WEBHOOK_BILLING, webhook_secret="")) as c:
        response = await c.post(WEBHOOK_PATH, content=body, headers=headers)
    assert response.status_code == 400 and "KVGATE_STRIPE_WEBHOOK_SECRET" in response.text
    assert await _plan(pg_pool, team_id) == "free"


async def test_upgrade_raises_the_teams_rate_limits_on_the_gateway_within_5s(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    model = unique("m-bill")
    worker = unique("w-bill")
    team_id, key, customer = await paying_team(pg_pool)
    env = {
        "KVGATE_STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "KVGATE_STRIPE_PRICES": f'{{"team": "{TEAM_PRICE}"}}',
    }
    with stub_upstream(worker) as (upstream, _):
        await register_workers(pg_pool, model, {worker: upstream})
        try:
            with gateway_process(pg_dsn, **env) as (url, _):
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    chat = {
                        "model": model,
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    auth = {"authorization": f"Bearer {key}"}

                    async def call() -> httpx.Response:
                        return await client.post("/v1/chat/completions", json=chat, headers=auth)

                    statuses = [(await call()).status_code for _ in range(12)]
                    assert statuses[0] == 200 and statuses[-1] == 429  # free: 10 per minute
                    assert (await call()).headers["x-ratelimit-limit-requests"] == "10"
                    upgrade = event(
                        "customer.subscription.updated", subscription("sub_up", customer)
                    )
                    body, headers = signed(upgrade)
                    sent = await client.post(WEBHOOK_PATH, content=body, headers=headers)
                    assert sent.status_code == 200, sent.text
                    deadline = time.monotonic() + 5.0
                    while True:
                        response = await call()
                        if response.status_code == 200:
                            break
                        assert time.monotonic() < deadline, "limits not raised within 5 s"
                    assert response.headers["x-ratelimit-limit-requests"] == "600"
                    assert await _plan(pg_pool, team_id) == "team"
        finally:
            await deregister(pg_pool, [worker])
