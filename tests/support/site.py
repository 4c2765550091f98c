"""Helpers for the site and admin tests: the real routes in process, staff accounts.

The app is the accounts' routes plus the site's and the admin's (as ``gateway.app`` lists
them) behind the security-headers middleware, over the session Postgres, through httpx's
ASGI transport. The client address is 127.0.0.1, a trusted proxy, so a test picks its own
client IP with ``X-Forwarded-For``.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware

from gateway.admin.routes import admin_routes
from gateway.config import GatewayConfig
from gateway.console.routes import console_routes
from gateway.pages.headers import SecurityHeadersMiddleware
from gateway.public.config import SiteConfig
from gateway.public.routes import public_routes
from tests.support.accounts import (
    Account,
    accounts_config,
    browser,
    form_token,
    shared_site,
    sign_up,
)

CONTACT = {
    "name": "Ada Lovelace",
    "company": "Analytical Engines Ltd",
    "team_size": "51-200",
    "monthly_tokens": "1B-10B",
    "use_case": "multi-turn support agents",
    "message": "We want dedicated capacity.",
}


def site_app(
    pool: asyncpg.Pool, accounts_overrides: dict[str, Any] | None = None, **site: Any
) -> Starlette:
    """Accounts + site + admin routes over ``pool``; ``site`` overrides SiteConfig fields
    (and ``accounts_overrides`` AccountsConfig's)."""
    config = accounts_config(**(accounts_overrides or {}))
    gateway = GatewayConfig(
        dsn="unused: the pool is given",
        trusted_proxies=GatewayConfig.parse_networks(["127.0.0.1/32"]),
        accounts=config,
        site=replace(SiteConfig(sales_email="sales@kvgate.test"), **site),
    )
    pages = shared_site(pool, config)
    return Starlette(
        routes=[
            *console_routes(pages),
            *public_routes(gateway, pages),
            *admin_routes(pages, gateway.site, gateway.worker_timeout_s),
        ],
        middleware=[Middleware(SecurityHeadersMiddleware)],
    )


def unique_email(domain: str = "example.com") -> str:
    """An address no other test uses."""
    return f"lead-{uuid.uuid4().hex[:10]}@{domain}"


async def submit_contact(
    client: httpx.AsyncClient, ip: str, email: str, **fields: str
) -> httpx.Response:
    """Post the contact form from client address ``ip``."""
    token = await form_token(client, "/contact")
    data = {"csrf_token": token, **CONTACT, "email": email, **fields}
    return await client.post("/contact", data=data, headers={"x-forwarded-for": ip})


async def staff_account(
    pool: asyncpg.Pool, app: Starlette, caplog: pytest.LogCaptureFixture
) -> Account:
    """A signed-in user (with a team of their own) made staff."""
    account = await sign_up(browser(app), caplog)
    await pool.execute("UPDATE users SET is_staff = true WHERE email = $1", account.email)
    return account


def fresh_ip() -> str:
    """A client address no other test uses (from the 10/8 block)."""
    n = uuid.uuid4().int
    return f"10.{n % 250}.{(n >> 8) % 250}.{(n >> 16) % 250 + 1}"
