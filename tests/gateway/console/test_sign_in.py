"""Sign-up, email verification, login, throttling, password reset and invitations."""

from __future__ import annotations

import logging
import uuid

import asyncpg
import httpx
import pytest

from tests.support.accounts import (
    PASSWORD,
    accounts_app,
    browser,
    csrf_of,
    emailed_link,
    form_token,
    path_of,
    sign_up,
)


def _email() -> str:
    return f"user-{uuid.uuid4().hex[:10]}@example.com"


async def _login(client: httpx.AsyncClient, email: str, password: str) -> httpx.Response:
    token = await form_token(client, "/login")
    data = {"csrf_token": token, "email": email, "password": password, "next": "/console"}
    return await client.post("/login", data=data)


async def test_signup_verify_then_console_and_owner_membership(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = await client.get(f"/console/teams/{account.team_id}/keys")
        assert page.status_code == 200 and account.email in page.text
    row = await pg_pool.fetchrow(
        "SELECT u.verified_at, m.role, t.plan, u.password_hash FROM users u "
        "JOIN memberships m ON m.user_id = u.id JOIN teams t ON t.id = m.team_id "
        "WHERE u.email = $1",
        account.email,
    )
    assert row["verified_at"] is not None and row["role"] == "owner" and row["plan"] == "free"
    assert row["password_hash"].startswith("$argon2id$") and PASSWORD not in row["password_hash"]


async def test_unverified_user_cannot_sign_in_and_gets_a_new_link(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.pages.mailer")
    app, _ = accounts_app(pg_pool)
    email = _email()
    async with browser(app) as client:
        token = await form_token(client, "/signup")
        data = {"csrf_token": token, "email": email, "team": f"t-{uuid.uuid4().hex}"}
        await client.post("/signup", data={**data, "password": PASSWORD})
        first = emailed_link(caplog, email, "verify")
        response = await _login(client, email, PASSWORD)
        assert response.status_code == 403 and "Check your email" in response.text
        assert emailed_link(caplog, email, "verify") != first
        assert (await client.get("/console")).status_code == 303  # still anonymous


async def test_signup_refuses_taken_email_and_short_password(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
    async with browser(app) as client:
        token = await form_token(client, "/signup")
        base = {"csrf_token": token, "team": f"t-{uuid.uuid4().hex}"}
        taken = await client.post(
            "/signup", data={**base, "email": account.email.upper(), "password": PASSWORD}
        )
        assert taken.status_code == 400 and "exists already" in taken.text
        short = await client.post("/signup", data={**base, "email": _email(), "password": "short"})
        assert short.status_code == 400 and "at least 10 characters" in short.text


async def test_login_logout_and_wrong_password(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as first:
        account = await sign_up(first, caplog)
    async with browser(app) as client:
        wrong = await _login(client, account.email, "not the password")
        assert wrong.status_code == 401 and "Wrong email or password" in wrong.text
        unknown = await _login(client, _email(), PASSWORD)
        assert unknown.status_code == 401 and "Wrong email or password" in unknown.text
        ok = await _login(client, account.email, PASSWORD)
        assert ok.status_code == 303 and ok.headers["location"] == "/console"
        assert (await client.get(f"/console/teams/{account.team_id}/keys")).status_code == 200
        token = await form_token(client, f"/console/teams/{account.team_id}/keys")
        out = await client.post("/logout", data={"csrf_token": token})
        assert out.status_code == 303
        assert (await client.get(f"/console/teams/{account.team_id}/keys")).status_code == 303


async def test_ten_wrong_passwords_in_a_row_slow_further_attempts(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, config = accounts_app(pg_pool)
    async with browser(app) as first:
        account = await sign_up(first, caplog)
    async with browser(app) as client:
        statuses = [
            (await _login(client, account.email, f"guess {i}")).status_code for i in range(10)
        ]
        assert statuses == [401] * 10
        # The right password now waits too: the attempt is refused before it is checked.
        refused = await _login(client, account.email, PASSWORD)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "Too many failed attempts" in refused.text
        assert "kvg_session" not in refused.headers.get("set-cookie", "")
    assert config.login_free_failures == 10


async def test_nine_wrong_passwords_do_not_block_the_right_one(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as first:
        account = await sign_up(first, caplog)
    async with browser(app) as client:
        for i in range(9):
            assert (await _login(client, account.email, f"guess {i}")).status_code == 401
        assert (await _login(client, account.email, PASSWORD)).status_code == 303
    assert (
        await pg_pool.fetchval("SELECT 1 FROM login_attempts WHERE email = $1", account.email)
        is None
    )


async def test_password_reset_link_sets_a_new_password_once(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as first:
        account = await sign_up(first, caplog)
        async with browser(app) as client:
            token = await form_token(client, "/password/forgot")
            sent = await client.post(
                "/password/forgot", data={"csrf_token": token, "email": account.email}
            )
            assert sent.status_code == 200 and "reset link is on its way" in sent.text
            reset_path = path_of(emailed_link(caplog, account.email, "password/reset"))
            form = await client.get(reset_path)
            assert form.status_code == 200
            reset_token = reset_path.split("token=")[1]
            data = {"csrf_token": token, "token": reset_token, "password": "a brand new secret"}
            done = await client.post("/password/reset", data=data)
            assert done.status_code == 303
            again = await client.post("/password/reset", data=data)
            assert again.status_code == 400 and "used up or expired" in again.text
        # The reset ended the other browser's session.
        assert (await first.get(f"/console/teams/{account.team_id}/keys")).status_code == 303
    async with browser(app) as client:
        assert (await _login(client, account.email, PASSWORD)).status_code == 401
        assert (await _login(client, account.email, "a brand new secret")).status_code == 303


async def test_owner_invites_a_member_who_joins_with_the_emailed_link(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as owner_client, browser(app) as guest_client:
        owner = await sign_up(owner_client, caplog)
        guest = await sign_up(guest_client, caplog)
        members = f"/console/teams/{owner.team_id}/members"
        token = await form_token(owner_client, members)
        sent = await owner_client.post(
            members + "/invite", data={"csrf_token": token, "email": guest.email}
        )
        assert sent.status_code == 200 and f"Invitation sent to {guest.email}" in sent.text
        invite = path_of(emailed_link(caplog, guest.email, "invite"))
        # Before joining, the guest cannot see the team; the owner's link works only for them.
        assert (await guest_client.get(members)).status_code == 404
        assert (await owner_client.get(invite)).status_code == 400
        page = await guest_client.get(invite)
        assert page.status_code == 200
        data = {"csrf_token": csrf_of(page.text), "token": invite.split("token=")[1]}
        joined = await guest_client.post("/invite", data=data)
        assert joined.status_code == 303
        listing = await guest_client.get(members)
        assert listing.status_code == 200 and guest.email in listing.text
        # A member may not invite: that is for owners.
        token = await form_token(guest_client, members)
        refused = await guest_client.post(
            members + "/invite", data={"csrf_token": token, "email": _email()}
        )
        assert refused.status_code == 403


async def test_reset_links_to_one_address_are_capped_per_hour(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, config = accounts_app(pg_pool)
    async with browser(app) as first:
        account = await sign_up(first, caplog)
    async with browser(app) as client:
        token = await form_token(client, "/password/forgot")
        for _ in range(config.mails_per_hour + 3):
            sent = await client.post(
                "/password/forgot", data={"csrf_token": token, "email": account.email}
            )
            assert sent.status_code == 200  # the page never tells whether mail went out
    mailed = [
        r
        for r in caplog.records
        if r.name == "gateway.pages.mailer"
        and f"email to {account.email} " in r.getMessage()
        and "Reset your kvgate password" in r.getMessage()
    ]
    assert len(mailed) == config.mails_per_hour
