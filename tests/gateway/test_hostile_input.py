"""What a careless or hostile client can send the whole gateway app: a clear 4xx, never a 500.

In process (the real app, its middleware and exception handlers, on the real Postgres).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from gateway.app import build_app
from gateway.config import GatewayConfig
from tests.support.accounts import accounts_config, form_token, sign_up

BIG = str(2**70)


@pytest.fixture
async def client(pg_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(GatewayConfig(dsn=pg_dsn, accounts=accounts_config()))
    async with app.state.gateway.lifespan(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/login", {"email": "a\x00@example.com", "password": "x"}),
        ("/signup", {"email": "nul@example.com", "team": "t\x00", "password": "p" * 12}),
        ("/password/forgot", {"email": "x\x00@example.com"}),
        (
            "/contact",
            {
                "name": "N\x00",
                "email": "n@example.com",
                "company": "c",
                "team_size": "1-10",
                "monthly_tokens": "< 10M",
                "message": "m",
            },
        ),
    ],
)
async def test_a_nul_byte_in_a_form_is_a_400(
    client: httpx.AsyncClient, path: str, fields: dict[str, str]
) -> None:
    token = await form_token(client, path)
    response = await client.post(path, data={"csrf_token": token, **fields})
    assert response.status_code == 400, response.text


async def test_an_id_beyond_64_bits_is_not_a_500(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed in, so the id reaches the database (a guard once asked Postgres with it)."""
    await sign_up(client, caplog)
    for path in (f"/console/teams/{BIG}/keys", f"/console/teams/{BIG}/usage"):
        response = await client.get(path)
        assert response.status_code in (400, 404), (path, response.text)


async def test_a_trailing_slash_is_never_redirected_to_the_callers_host(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/admin/", headers={"host": "evil.example"})
    assert "evil.example" not in response.headers.get("location", "")
    assert response.status_code == 404


async def test_a_413_carries_the_security_headers(pg_dsn: str) -> None:
    app = build_app(GatewayConfig(dsn=pg_dsn, accounts=accounts_config(), body_limit=100))
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        response = await c.post("/v1/chat/completions", content=b"x" * 1000)
    assert response.status_code == 413
    assert response.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" in response.headers


async def test_readyz_does_not_tell_the_public_why_the_database_is_down(
    client: httpx.AsyncClient, pg_pool: asyncpg.Pool
) -> None:
    gw = client._transport.app.state.gateway  # type: ignore[attr-defined]
    await gw.pool.close()  # as if Postgres went away
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "database unavailable"}
