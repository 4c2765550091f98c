"""Helpers for the accounts, console and billing tests.

In-process tests serve the real account routes (``gateway.console.routes``) on the session
Postgres through httpx's ASGI transport; emails are read back from the log, the way a
local user would follow them.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette

from gateway.billing.config import BillingConfig
from gateway.console.routes import console_routes
from gateway.pages.config import AccountsConfig
from gateway.pages.kit import PageKit
from gateway.pages.mailer import Mailer

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
_LINK = re.compile(r"(https?://\S+?(/verify|/password/reset|/invite)\?token=[\w%-]+)")


def accounts_config(**overrides: Any) -> AccountsConfig:
    """The tests' AccountsConfig; ``overrides`` replace its fields."""
    return replace(
        AccountsConfig(
            session_secret="test-secret",
            public_base_url="http://console.test",
            billing=BillingConfig(webhook_secret="whsec_test"),
            # every in-process test posts from the transport's one address
            auth_per_address=1_000_000,
        ),
        **overrides,
    )


def shared_site(pool: asyncpg.Pool, config: AccountsConfig) -> PageKit:
    """The page machinery the routes share, over ``pool``."""
    return PageKit(config, lambda: pool, Mailer(config.smtp))


def accounts_app(
    pool: asyncpg.Pool, stripe_http: Any = None, **overrides: Any
) -> tuple[Starlette, AccountsConfig]:
    """The account routes alone, over ``pool``; ``overrides`` replace AccountsConfig fields."""
    config = accounts_config(**overrides)
    app = Starlette(routes=console_routes(shared_site(pool, config), stripe_http))
    return app, config


def browser(app: Starlette, https: bool = False) -> httpx.AsyncClient:
    """A cookie-keeping client on ``app`` that does not follow redirects by itself."""
    scheme = "https" if https else "http"
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url=f"{scheme}://console.test"
    )


def csrf_of(html: str) -> str:
    """The CSRF token in a rendered form."""
    match = _CSRF.search(html)
    assert match, "no csrf_token field in the page"
    return match.group(1)


async def form_token(client: httpx.AsyncClient, path: str) -> str:
    """GET ``path`` and return its form's CSRF token."""
    response = await client.get(path)
    assert response.status_code == 200, response.text
    return csrf_of(response.text)


def emailed_link(caplog: pytest.LogCaptureFixture, to: str, kind: str) -> str:
    """The newest ``kind`` link (verify, password/reset, invite) mailed to ``to``."""
    for record in reversed(caplog.records):
        text = record.getMessage()
        if record.name == "gateway.pages.mailer" and f"email to {to} " in text:
            for link, path in _LINK.findall(text):
                if path == "/" + kind:
                    return link
    raise AssertionError(f"no {kind} link mailed to {to} in the log")


def path_of(link: str) -> str:
    """``link`` without scheme and host."""
    return "/" + link.split("/", 3)[3]


@dataclass
class Account:
    """A signed-up, verified, signed-in user and their team."""

    email: str
    team_id: int
    client: httpx.AsyncClient
    #: The Set-Cookie header that started the session (after following the email link).
    session_cookie: str


async def sign_up(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, email: str | None = None
) -> Account:
    """Sign up through the forms, follow the emailed link; the client ends signed in."""
    caplog.set_level(logging.WARNING, logger="gateway.pages.mailer")
    email = email or f"user-{uuid.uuid4().hex[:10]}@example.com"
    token = await form_token(client, "/signup")
    team = f"team-{uuid.uuid4().hex[:10]}"
    data = {"csrf_token": token, "email": email, "team": team, "password": PASSWORD}
    response = await client.post("/signup", data=data)
    assert response.status_code == 200, response.text
    verified = await client.get(path_of(emailed_link(caplog, email, "verify")))
    assert verified.status_code == 303 and verified.headers["location"] == "/console"
    response = await client.get("/console")
    assert response.status_code == 303, response.text
    team_id = int(response.headers["location"].split("/")[3])
    return Account(email, team_id, client, verified.headers["set-cookie"])
