"""The contact-sales form: a valid submission becomes a lead and a mail to sales; spam
protection (honeypot, per-IP limit); a failing mail server never loses a lead."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from gateway.pages.config import SmtpConfig
from kvgate.stack.ports import free_port
from tests.support.accounts import browser
from tests.support.site import fresh_ip, site_app, submit_contact, unique_email


async def _lead(pool: asyncpg.Pool, email: str) -> asyncpg.Record | None:
    return await pool.fetchrow("SELECT * FROM leads WHERE email = $1", email)


async def test_a_valid_submission_stores_the_lead_and_mails_sales(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.pages.mailer")
    ip, email = fresh_ip(), unique_email("acme.test")
    async with browser(site_app(pg_pool)) as client:
        response = await submit_contact(client, ip, email.upper())
        assert response.status_code == 303, response.text
        assert response.headers["location"] == "/contact/thanks"
        thanks = await client.get("/contact/thanks")
        assert thanks.status_code == 200 and "Thank you" in thanks.text
    lead = await _lead(pg_pool, email)
    assert lead is not None
    assert (lead["company"], lead["team_size"], lead["status"]) == (
        "Analytical Engines Ltd",
        "51-200",
        "new",
    )
    assert str(lead["client_ip"]) == ip and lead["email_domain"] == "acme.test"
    assert lead["notified_at"] is not None
    mails = [
        r.getMessage() for r in caplog.records if "email to sales@kvgate.test" in r.getMessage()
    ]
    assert any(email in m and f"/admin/leads/{lead['id']}" in m for m in mails), mails


async def test_a_filled_honeypot_is_rejected_and_nothing_is_stored(pg_pool: asyncpg.Pool) -> None:
    email = unique_email()
    async with browser(site_app(pg_pool)) as client:
        response = await submit_contact(client, fresh_ip(), email, website="http://spam.example")
    assert response.status_code == 400
    assert await _lead(pg_pool, email) is None


async def test_the_submission_after_the_per_ip_limit_is_refused(pg_pool: asyncpg.Pool) -> None:
    ip, other_ip = fresh_ip(), fresh_ip()
    async with browser(site_app(pg_pool, contact_limit=3, contact_window_s=3600)) as client:
        for _ in range(3):
            response = await submit_contact(client, ip, unique_email())
            assert response.status_code == 303, response.text
        refused = unique_email()
        response = await submit_contact(client, ip, refused)
        assert response.status_code == 429
        assert "Too many messages" in response.text
        assert await _lead(pg_pool, refused) is None
        # The limit is per address: another client is not affected.
        assert (await submit_contact(client, other_ip, unique_email())).status_code == 303
    count = await pg_pool.fetchval("SELECT count(*) FROM leads WHERE client_ip = $1::inet", ip)
    assert count == 3


async def test_a_lead_survives_a_failing_mail_server(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing listens on this port: the SMTP connection is refused.
    smtp = SmtpConfig(host="127.0.0.1", port=free_port(), starttls=False)
    email = unique_email()
    async with browser(site_app(pg_pool, {"smtp": smtp})) as client:
        response = await submit_contact(client, fresh_ip(), email)
    assert response.status_code == 303, response.text
    lead = await _lead(pg_pool, email)
    assert lead is not None and lead["notified_at"] is None
    assert any("sales notification failed" in r.getMessage() for r in caplog.records)


async def test_invalid_fields_reshow_the_form_with_the_problems(pg_pool: asyncpg.Pool) -> None:
    email = "not-an-email"
    async with browser(site_app(pg_pool)) as client:
        response = await submit_contact(client, fresh_ip(), email, company="", team_size="huge")
    assert response.status_code == 400
    assert "Enter a work email" in response.text and "Pick a team size" in response.text
    assert 'value="Ada Lovelace"' in response.text  # what was typed is kept
    assert await _lead(pg_pool, email) is None


async def test_the_form_needs_its_csrf_token(pg_pool: asyncpg.Pool) -> None:
    email = unique_email()
    async with browser(site_app(pg_pool)) as client:
        response = await client.post("/contact", data={"email": email, "name": "x"})
    assert response.status_code == 403
    assert await _lead(pg_pool, email) is None
