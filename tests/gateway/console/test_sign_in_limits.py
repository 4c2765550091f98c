"""Password guessing against the sign-in forms: throttled per email and address, capped per
address, without locking the owner out, and without telling which emails have accounts.

In process on the session Postgres; each client address is the ASGI transport's ``client``.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import httpx
import pytest

from gateway.pages.kit import PageKit
from tests.support.accounts import PASSWORD, accounts_app, form_token, sign_up
from tests.support.site import fresh_ip
from tests.support.worker import serving


def _from(app, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def _login(client: httpx.AsyncClient, email: str, password: str) -> int:
    token = await form_token(client, "/login")
    data = {"csrf_token": token, "email": email, "password": password}
    return (await client.post("/login", data=data)).status_code


async def test_concurrent_wrong_passwords_cannot_pass_the_throttle(pg_pool: asyncpg.Pool) -> None:
    """40 at once for one account and address: only the free 10 are checked, the rest wait."""
    app, config = accounts_app(pg_pool, auth_per_address=1000)
    email = f"victim-{uuid.uuid4().hex[:8]}@example.com"
    async with _from(app, fresh_ip()) as client:
        codes = await asyncio.gather(*(_login(client, email, "wrong guess") for _ in range(40)))
    assert codes.count(401) == config.login_free_failures
    assert codes.count(429) == 40 - config.login_free_failures


async def test_a_strangers_failures_do_not_lock_the_owner_out(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, config = accounts_app(pg_pool, auth_per_address=1000)
    async with _from(app, fresh_ip()) as owner:
        account = await sign_up(owner, caplog)
        await owner.post("/logout", data={"csrf_token": await form_token(owner, "/login")})
        async with _from(app, fresh_ip()) as stranger:
            for _ in range(config.login_free_failures + 1):
                await _login(stranger, account.email, "wrong guess")
            assert await _login(stranger, account.email, PASSWORD) == 429
        assert await _login(owner, account.email, PASSWORD) == 303


async def test_one_address_may_send_only_so_many_password_forms(pg_pool: asyncpg.Pool) -> None:
    """Each costs a password hash: beyond the cap an address waits, whatever emails it tries."""
    app, _ = accounts_app(pg_pool, auth_per_address=3)
    crowd = fresh_ip()
    async with _from(app, crowd) as client:
        codes = [await _login(client, f"{uuid.uuid4().hex[:8]}@example.com", "x") for _ in range(4)]
        token = await form_token(client, "/signup")
        signups = [
            (
                await client.post("/signup", data={"csrf_token": token, "email": "a@b.co"})
            ).status_code
            for _ in range(4)
        ]
    assert codes == [401, 401, 401, 429]
    assert signups[-1] == 429 and 429 not in signups[:3]  # each form has its own count
    async with _from(app, fresh_ip()) as elsewhere:
        assert await _login(elsewhere, "someone@example.com", "x") == 401


async def test_a_reset_request_is_answered_before_any_mail_is_sent(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer for an address with an account may not wait on that account's work (the
    lookup, the token, the mail), or its timing tells which addresses have accounts."""
    app, _ = accounts_app(pg_pool)
    async with _from(app, fresh_ip()) as client:
        account = await sign_up(client, caplog)
    release, mailed = asyncio.Event(), asyncio.Event()
    real = PageKit.mail_link

    async def held(self: PageKit, *args: object, **kwargs: object) -> None:
        await release.wait()
        await real(self, *args, **kwargs)
        mailed.set()

    monkeypatch.setattr(PageKit, "mail_link", held)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        token = await form_token(client, "/password/forgot")
        data = {"csrf_token": token, "email": account.email}
        answer = await client.post("/password/forgot", data=data)
        assert answer.status_code == 200 and "on its way" in answer.text
        assert not mailed.is_set()
        release.set()
        await asyncio.wait_for(mailed.wait(), 10)
