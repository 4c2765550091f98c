"""Console keys and usage: the secret is shown once, works, and lives nowhere else."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway import accounts, keys
from gateway.usage import UsageRecorder, UsageRow
from tests.support.accounts import accounts_app, browser, form_token, sign_up

_SECRET = re.compile(r'<code id="new-secret">(kvg_[\w-]+)</code>')


async def _database_text(pool: asyncpg.Pool) -> str:
    """Every row of every table of ours, as text."""
    tables = await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    parts = []
    for (table,) in tables:
        rows = await pool.fetch(f'SELECT t::text FROM "{table}" t')
        parts.extend(r[0] for r in rows)
    return "\n".join(parts)


async def test_key_secret_is_shown_once_and_stored_only_as_its_hash(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/keys"
        token = await form_token(client, page)
        created = await client.post(page, data={"csrf_token": token, "name": "production"})
        assert created.status_code == 201
        assert created.headers["cache-control"] == "no-store"
        match = _SECRET.search(created.text)
        assert match, created.text
        secret = match.group(1)
        # The key is real: the gateway's lookup resolves it to this team.
        owner = await accounts.lookup_key(pg_pool, secret)
        assert owner is not None and owner.team_id == account.team_id
        # Every later page shows the prefix only.
        later = [
            await client.get(page),
            await client.get(f"/console/teams/{account.team_id}/usage"),
            await client.get(f"/console/teams/{account.team_id}/usage.csv"),
        ]
        for response in later:
            assert response.status_code == 200 and secret not in response.text
        assert keys.visible_prefix(secret) in later[0].text
        assert "production" in later[0].text
    stored = await _database_text(pg_pool)
    assert secret not in stored and secret[4:] not in stored
    assert keys.hash_key(secret).hex() in stored.replace("\\x", "")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert secret not in logged


async def test_revoke_stops_the_key_and_marks_it_in_the_list(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        page = f"/console/teams/{account.team_id}/keys"
        token = await form_token(client, page)
        created = await client.post(page, data={"csrf_token": token, "name": "temp"})
        match = _SECRET.search(created.text)
        assert match, created.text
        secret = match.group(1)
        key_id = await pg_pool.fetchval(
            "SELECT id FROM api_keys WHERE key_hash = $1", keys.hash_key(secret)
        )
        revoked = await client.post(f"{page}/{key_id}/revoke", data={"csrf_token": token})
        assert revoked.status_code == 303
        assert await accounts.lookup_key(pg_pool, secret) is None
        assert 'class="revoked"' in (await client.get(page)).text
        # A key id of another team is not found through this team's URL.
        _, other_secret = await accounts.create_key(
            pg_pool, (await accounts.create_team(pg_pool, f"t-{uuid.uuid4().hex}")).name
        )
        other_id = await pg_pool.fetchval(
            "SELECT id FROM api_keys WHERE key_hash = $1", keys.hash_key(other_secret)
        )
        missing = await client.post(f"{page}/{other_id}/revoke", data={"csrf_token": token})
        assert missing.status_code == 404
        assert await accounts.lookup_key(pg_pool, other_secret) is not None


async def test_usage_page_and_csv_show_requests_tokens_and_cached_split(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        info, _ = await accounts.create_key(
            pg_pool,
            await pg_pool.fetchval("SELECT name FROM teams WHERE id = $1", account.team_id),
            "batch",
        )
        recorder = UsageRecorder(pg_pool, flush_s=60, buffer_max=100)
        now = datetime.now(UTC)
        for i, (ts, prompt, cached, out) in enumerate(
            [(now, 100, 40, 7), (now, 50, 0, 3), (now - timedelta(days=1), 10, 10, 1)]
        ):
            recorder.record(
                UsageRow(
                    f"req-{uuid.uuid4().hex}-{i}",
                    ts,
                    account.team_id,
                    info.id,
                    None,
                    f"team:{account.team_id}",
                    "tiny",
                    "w1",
                    prompt,
                    cached,
                    out,
                    0,
                    5.0,
                    20.0,
                    200,
                )
            )
        await recorder.flush()
        page = await client.get(f"/console/teams/{account.team_id}/usage?days=7")
        assert page.status_code == 200
        html = page.text
        assert html.count("<svg") == 3 and "Tokens per day" in html
        today = now.date().isoformat()
        # today: 2 requests, 110 uncached input, 40 cached, 10 output
        assert f"<td>{today}</td><td>2</td><td>110</td><td>40</td><td>10</td>" in html
        assert "<td>3</td><td>110</td><td>50</td><td>11</td>" in html  # the key, both days
        csv = await client.get(f"/console/teams/{account.team_id}/usage.csv?days=7")
        assert csv.headers["content-type"].startswith("text/csv")
        lines = csv.text.strip().splitlines()
        assert lines[0].startswith(
            "day,model,requests,uncached_input_tokens,cached_input_tokens,output_tokens,"
        )  # then the tiers, tests/gateway/console/test_usage_tiers.py
        assert f"{today},tiny,2,110,40,10,0,0,0,0" in lines
        yesterday = (now - timedelta(days=1)).date().isoformat()
        assert f"{yesterday},tiny,1,0,10,1,0,0,0,0" in lines
