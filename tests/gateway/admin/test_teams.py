"""/admin teams: the list and a team's page; suspension blocks the team's keys on a real
gateway (and a key made during it), unsuspension restores exactly the keys it blocked."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from gateway import accounts
from gateway.admin import teams
from tests.support.accounts import form_token
from tests.support.gateway import (
    apoll,
    deregister,
    gateway_process,
    register_workers,
    stub_upstream,
    team_key,
    unique,
)
from tests.support.site import site_app, staff_account


async def _status(client: httpx.AsyncClient, model: str, secret: str) -> int:
    response = await client.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {secret}"},
        json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    return response.status_code


async def test_suspension_blocks_the_teams_keys_on_the_gateway_until_lifted(
    pg_dsn: str, pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    team_id, secret = await team_key(pg_pool)
    team = await pg_pool.fetchval("SELECT name FROM teams WHERE id = $1", team_id)
    revoked_before, _ = await accounts.create_key(pg_pool, team, "old")
    await accounts.revoke_key(pg_pool, revoked_before.id)
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    page = f"/admin/teams/{team_id}"
    model, worker = unique("m-suspend"), unique("w-suspend")
    with stub_upstream(worker) as (upstream, _):
        await register_workers(pg_pool, model, {worker: upstream})
        try:
            with gateway_process(pg_dsn) as (url, _):
                async with httpx.AsyncClient(base_url=url, timeout=30) as gw:
                    assert await _status(gw, model, secret) == 200

                    token = await form_token(staff.client, page)
                    suspended = await staff.client.post(
                        page + "/suspend", data={"csrf_token": token, "reason": "chargeback"}
                    )
                    assert suspended.status_code == 303
                    await apoll(lambda: _status(gw, model, secret), lambda s: s == 401, 10)
                    # A key created while suspended does not work either.
                    _, during = await accounts.create_key(pg_pool, team, "during")
                    assert await _status(gw, model, during) == 401
                    assert "suspended since" in (await staff.client.get(page)).text

                    lifted = await staff.client.post(
                        page + "/unsuspend", data={"csrf_token": token}
                    )
                    assert lifted.status_code == 303
                    # each key's cached verdict lapses on its own (it was looked up later)
                    await apoll(lambda: _status(gw, model, secret), lambda s: s == 200, 10)
                    await apoll(lambda: _status(gw, model, during), lambda s: s == 200, 10)
        finally:
            await deregister(pg_pool, [worker])
    # The key revoked before the suspension stays revoked.
    still = await pg_pool.fetchval(
        "SELECT revoked_at FROM api_keys WHERE id = $1", revoked_before.id
    )
    assert still is not None
    actions = await pg_pool.fetch(
        "SELECT action, actor_email, after FROM admin_audit WHERE target = $1 ORDER BY id",
        f"team:{team_id}",
    )
    assert [a["action"] for a in actions] == ["team.suspend", "team.unsuspend"]
    assert all(a["actor_email"] == staff.email for a in actions)
    assert "chargeback" in actions[0]["after"]


async def test_suspending_twice_is_refused_and_the_lists_show_plan_usage_and_keys(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    team_id, _ = await team_key(pg_pool)
    team = await pg_pool.fetchval("SELECT name FROM teams WHERE id = $1", team_id)
    await pg_pool.execute(
        "INSERT INTO usage_daily (day, team_id, model, requests, prompt_tokens, "
        "completion_tokens) VALUES (current_date, $1, 'm', 7, 1000, 234)",
        team_id,
    )
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    listing = (await staff.client.get("/admin/teams", params={"q": team})).text
    row = listing[listing.index(team) :]
    assert "team" in row and "1,234" in row and ">7<" in row
    page = f"/admin/teams/{team_id}"
    token = await form_token(staff.client, page)
    data = {"csrf_token": token, "reason": "abuse"}
    assert (await staff.client.post(page + "/suspend", data=data)).status_code == 303
    again = await staff.client.post(page + "/suspend", data=data)
    assert again.status_code == 400 and "already suspended" in again.text
    html = (await staff.client.get(page)).text
    assert 'class="revoked"' in html  # its key, blocked
    usage = (await staff.client.get("/admin/usage")).text
    assert team in usage and "svg" in usage


async def test_a_key_revoked_during_a_suspension_stays_revoked_after_it(
    pg_pool: asyncpg.Pool,
) -> None:
    team_id, _ = await team_key(pg_pool)
    team = await pg_pool.fetchval("SELECT name FROM teams WHERE id = $1", team_id)
    kept, _ = await accounts.create_key(pg_pool, team, "kept")
    dropped, _ = await accounts.create_key(pg_pool, team, "dropped")
    async with pg_pool.acquire() as conn, conn.transaction():
        blocked = await teams.suspend(conn, team_id, None, "review")
    assert {kept.id, dropped.id} <= set(blocked)
    _, during = await accounts.create_key(pg_pool, team, "during")
    # Revoking an already-blocked key, as the owner or `kvgate admin keys revoke` would.
    assert (await accounts.revoke_key(pg_pool, dropped.id)).revoked_at is not None
    async with pg_pool.acquire() as conn, conn.transaction():
        restored = await teams.unsuspend(conn, team_id)
    assert kept.id in restored and dropped.id not in restored
    assert await accounts.lookup_key(pg_pool, during) is not None
    state = dict(
        await pg_pool.fetch(
            "SELECT id, revoked_at IS NOT NULL FROM api_keys WHERE id = ANY($1::bigint[])",
            [kept.id, dropped.id],
        )
    )
    assert state == {kept.id: False, dropped.id: True}


async def test_a_key_made_while_a_suspension_commits_is_born_revoked(
    pg_pool: asyncpg.Pool,
) -> None:
    """The key is asked for after the suspension revoked the team's keys but before it
    committed: it must not come out active."""
    team = await accounts.create_team(pg_pool, unique("race"))
    async with pg_pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await teams.suspend(conn, team.id, None, "abuse")
        create = asyncio.create_task(accounts.create_key(pg_pool, team.name, "sneaky"))

        async def waiting_or_done() -> bool:
            waiting = await pg_pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO api_keys%'"
            )
            return create.done() or waiting > 0

        await apoll(waiting_or_done, bool, what="the key's insert has run or waits")
        await tx.commit()
    info, _ = await create
    revoked_at = await pg_pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", info.id)
    kept = await pg_pool.fetchval(
        "SELECT key_ids FROM team_suspensions WHERE team_id = $1", team.id
    )
    assert revoked_at is not None and info.id in kept  # and restored on unsuspension
