"""Which email addresses sign-up, invitations and contact sales accept (one rule for all)."""

from __future__ import annotations

import httpx
import pytest

from gateway.pages.users import is_valid_email
from tests.support.accounts import accounts_app, form_token


@pytest.mark.parametrize(
    "email",
    ["you@example.com", "first.last+tag@mail.example.co.uk", "o'neil@example.io", "a@b.co"],
)
def test_ordinary_addresses_are_accepted(email: str) -> None:
    assert is_valid_email(email)


@pytest.mark.parametrize(
    "email",
    [
        "a@b.co\r\nBcc: victim@example.com",  # a header line smuggled into the mail
        "a@b.co\nX: y",
        "a b@example.com",
        "a@example",
        "@example.com",
        "a@@example.com",
        "a@-example.com",
        "a..b@example.com",
        '"quoted"@example.com',
        "a@exa\x00mple.com",
        "x" * 65 + "@example.com",
        "a@" + "b" * 250 + ".com",
    ],
)
def test_addresses_that_could_carry_anything_else_are_refused(email: str) -> None:
    assert not is_valid_email(email)


async def test_sign_up_with_a_header_in_the_address_is_a_400_and_creates_nobody(
    pg_pool,
) -> None:
    app, _ = accounts_app(pg_pool)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        token = await form_token(client, "/signup")
        email = "smuggle@example.com\r\nBcc: victim@example.com"
        data = {"csrf_token": token, "email": email, "team": "t-smuggle", "password": "p" * 14}
        response = await client.post("/signup", data=data)
    assert response.status_code == 400
    assert await pg_pool.fetchval("SELECT count(*) FROM users WHERE email LIKE 'smuggle@%'") == 0
