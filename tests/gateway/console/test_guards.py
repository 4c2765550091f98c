"""Every console route refuses anonymous browsers and other teams; every form needs CSRF.

The routes are enumerated from the app itself, so a page added later is covered too.
"""

from __future__ import annotations

import asyncpg
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.console.routes import WEBHOOK_PATH
from tests.support.accounts import accounts_app, browser, form_token, sign_up

#: Path parameters filled in for each route: the team is the *owner's* team below.
_KEY_ID = 1


def _routes(app: Starlette) -> list[tuple[str, str]]:
    out = []
    for route in app.routes:
        if isinstance(route, Route):
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    out.append((method, route.path))
    return out


def _fill(path: str, team_id: int) -> str:
    return (
        path.replace("{team_id:int}", str(team_id))
        .replace("{key_id:int}", str(_KEY_ID))
        .replace("{user_id:int}", "1")
    )


async def test_every_console_route_redirects_anonymous_browsers_to_login(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as owner_client:
        owner = await sign_up(owner_client, caplog)
    console = [(m, p) for m, p in _routes(app) if p.startswith("/console") or p == "/invite"]
    assert len(console) >= 12
    async with browser(app) as anonymous:
        token = await form_token(anonymous, "/login")  # a valid CSRF token, but no session
        for method, path in console:
            url = _fill(path, owner.team_id)
            if method == "GET":
                response = await anonymous.get(url)
            else:
                response = await anonymous.post(url, data={"csrf_token": token})
            assert response.status_code == 303, (method, url, response.status_code)
            assert response.headers["location"].startswith("/login?next="), (method, url)


async def test_every_team_route_is_404_for_users_of_other_teams(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as owner_client, browser(app) as other_client:
        owner = await sign_up(owner_client, caplog)
        other = await sign_up(other_client, caplog)
        # The other user's own pages work: the 404s below are about the team, not the user.
        assert (await other_client.get(f"/console/teams/{other.team_id}/keys")).status_code == 200
        token = await form_token(other_client, f"/console/teams/{other.team_id}/keys")
        team_routes = [(m, p) for m, p in _routes(app) if "{team_id:int}" in p]
        assert len(team_routes) >= 11
        for method, path in team_routes:
            url = _fill(path, owner.team_id)
            if method == "GET":
                response = await other_client.get(url)
            else:
                response = await other_client.post(url, data={"csrf_token": token, "plan": "team"})
            assert response.status_code == 404, (method, url, response.status_code)
        # Nothing was created in the owner's team by those posts.
        keys = await pg_pool.fetchval(
            "SELECT count(*) FROM api_keys WHERE team_id = $1", owner.team_id
        )
        assert keys == 0


async def test_every_form_without_a_valid_csrf_token_gets_403(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = accounts_app(pg_pool)
    async with browser(app) as client:
        account = await sign_up(client, caplog)
        forms = [p for m, p in _routes(app) if m == "POST" and p != WEBHOOK_PATH]
        assert len(forms) >= 11
        good = await form_token(client, f"/console/teams/{account.team_id}/keys")
        for path in forms:
            url = _fill(path, account.team_id)
            missing = await client.post(url, data={"name": "x", "email": account.email})
            assert missing.status_code == 403, (url, "missing")
            forged = await client.post(url, data={"csrf_token": good[:-4] + "0000"})
            assert forged.status_code == 403, (url, "forged")
        # A token from another browser (another cookie) is no good either.
        async with browser(app) as elsewhere:
            theirs = await form_token(elsewhere, "/login")
        stolen = await client.post(
            f"/console/teams/{account.team_id}/keys", data={"csrf_token": theirs}
        )
        assert stolen.status_code == 403
        assert (
            await pg_pool.fetchval(
                "SELECT count(*) FROM api_keys WHERE team_id = $1", account.team_id
            )
            == 0
        )
        # ...while the right token goes through.
        ok = await client.post(f"/console/teams/{account.team_id}/keys", data={"csrf_token": good})
        assert ok.status_code == 201


@pytest.mark.parametrize("https", [False, True])
async def test_session_cookie_is_httponly_lax_and_secure_behind_https(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, https: bool
) -> None:
    scheme = "https" if https else "http"
    app, _ = accounts_app(pg_pool, public_base_url=f"{scheme}://console.test")
    async with browser(app, https=https) as client:
        account = await sign_up(client, caplog)
    attributes = [a.strip().lower() for a in account.session_cookie.split(";")]
    assert attributes[0].startswith("kvg_session=")
    assert "httponly" in attributes and "samesite=lax" in attributes
    assert ("secure" in attributes) is https
