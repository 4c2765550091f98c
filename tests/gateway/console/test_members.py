"""Who may do what to a team: only owners revoke keys and remove members; the last owner
stays."""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest

from gateway import accounts
from tests.support.accounts import (
    Account,
    accounts_app,
    browser,
    csrf_of,
    emailed_link,
    form_token,
    path_of,
    sign_up,
)


async def _join(owner: Account, guest: Account, caplog: pytest.LogCaptureFixture) -> None:
    members = f"/console/teams/{owner.team_id}/members"
    token = await form_token(owner.client, members)
    await owner.client.post(members + "/invite", data={"csrf_token": token, "email": guest.email})
    invite = path_of(emailed_link(caplog, guest.email, "invite"))
    page = await guest.client.get(invite)
    data = {"csrf_token": csrf_of(page.text), "token": invite.split("token=")[1]}
    assert (await guest.client.post("/invite", data=data)).status_code == 303


async def _post(client: httpx.AsyncClient, page: str, action: str) -> httpx.Response:
    return await client.post(action, data={"csrf_token": await form_token(client, page)})


async def test_a_member_cannot_revoke_keys_and_an_owner_can_remove_the_member(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as owner_client, browser(app) as guest_client:
        owner = await sign_up(owner_client, caplog)
        guest = await sign_up(guest_client, caplog)
        await _join(owner, guest, caplog)
        team = await pg_pool.fetchval("SELECT name FROM teams WHERE id = $1", owner.team_id)
        key, _ = await accounts.create_key(pg_pool, team, "production")
        keys = f"/console/teams/{owner.team_id}/keys"
        listing = await guest_client.get(keys)
        assert listing.status_code == 200 and f"/keys/{key.id}/revoke" not in listing.text
        refused = await _post(guest_client, keys, f"{keys}/{key.id}/revoke")
        assert refused.status_code == 403
        assert (
            await pg_pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", key.id) is None
        )

        members = f"/console/teams/{owner.team_id}/members"
        guest_id = await pg_pool.fetchval("SELECT id FROM users WHERE email = $1", guest.email)
        owner_id = await pg_pool.fetchval("SELECT id FROM users WHERE email = $1", owner.email)
        assert (
            await _post(guest_client, members, f"{members}/{owner_id}/remove")
        ).status_code == 403
        removed = await _post(owner_client, members, f"{members}/{guest_id}/remove")
        assert removed.status_code == 303
        assert (await guest_client.get(members)).status_code == 404
        last = await _post(owner_client, members, f"{members}/{owner_id}/remove")
        assert last.status_code == 400 and re.search("last owner", last.text)
        assert (await owner_client.get(members)).status_code == 200
