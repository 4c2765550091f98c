"""Every route of the gateway, as anonymous, team member, team owner and staff.

The routes come from the application itself (``build_app(...).routes``), so a route added
later is crawled too — and fails here until the table below says what each role must get
from it. Requests go over HTTP to a real ``kvgate gateway`` process on the session
Postgres; each request carries a fresh session of its role (so /logout ends nothing else)
and, for forms, a valid CSRF token: a refusal is then the guard's, not the CSRF check's.
"""

from __future__ import annotations

import re

import asyncpg
import httpx

from gateway.console.routes import WEBHOOK_PATH
from gateway.pages import sessions
from gateway.pages.csrf import COOKIE as CSRF_COOKIE
from tests.support.crawl import app_routes, fill, make_world
from tests.support.gateway import gateway_process

ROLES = ("anonymous", "member", "owner", "staff")
LOGIN = "login"  # expected: a 303 to the login page

PUBLIC_PAGES = {
    "/", "/pricing", "/docs", "/playground", "/contact", "/contact/thanks", "/signup",
    "/login", "/password/forgot", "/healthz", "/readyz", "/metrics", "/openapi.json",
    "/benchmarks",
    "/v1/models",
}  # fmt: skip


def expected(role: str, method: str, path: str) -> set[int | str]:
    """What ``role`` must get from ``method path`` (the crawl's specification)."""
    anonymous = role == "anonymous"
    if method == "GET" and path in PUBLIC_PAGES:
        return {200}
    if path.startswith(("/admin", "/console")) or path == "/invite":
        if anonymous:
            return {LOGIN}
        if path.startswith("/admin"):
            if role != "staff":
                return {404}
            return {303} if path == "/admin" or method == "POST" else {200}
        if path == "/console":
            return {200} if role == "staff" else {303}  # staff have no team: a page saying so
        if path == "/invite":
            return {400, 404}  # no invitation token given
        if role == "staff":
            return {404}  # staff are not members of customers' teams
        if path.endswith("{team_id:int}"):
            return {303}  # to the team's keys page
        if method == "GET":
            return {200}
        if role == "member" and ("/billing/" in path or "/members/" in path or "/revoke" in path):
            return {403}  # owners only
        return {200, 201, 303, 400, 503}  # 503: billing without Stripe configured
    if path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        return {400}  # an empty body, whoever asks
    if path == "/v1/responses/{response_id}":
        return {404}  # no stored response of the caller's has that id
    if path == "/v1/models/{model:path}":
        return {404}  # no worker serves a model of that name
    if path == WEBHOOK_PATH:
        return {400}  # no Stripe signature
    if path == "/playground/prefill":
        return {400}  # no ?model= given
    if path == "/playground/cold-storage":
        return {415}  # a form post: the body must be JSON
    if path in ("/signup", "/login", "/password/forgot", "/password/reset", "/contact"):
        return {200, 303, 400, 401, 429}  # form posts with missing fields
    if path == "/logout":
        return {303}
    if path in ("/verify", "/password/reset"):
        return {200, 400}  # no token given
    raise AssertionError(f"the crawl has no expectation for {method} {path}: add one")


_FORM = {
    "name": "crawl",
    "email": "crawl-invitee@example.com",
    "status": "contacted",
    "body": "a note from the crawl",
    "reason": "crawl",
    "plan": "team",
}


async def test_every_route_answers_each_role_as_specified(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    world = await make_world(pg_pool)
    routes = app_routes()
    assert any(p.startswith("/admin") for _, p in routes) and any(p == "/" for _, p in routes)
    failures = []
    # No KVGATE_SESSION_SECRET: the site's form tokens must pass the console's checks too.
    with gateway_process(pg_dsn) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/contact")
            token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
            assert token is not None
            csrf = {CSRF_COOKIE: page.cookies[CSRF_COOKIE]}
            for method, path in routes:
                if path == "/static":
                    for asset in ("site.css", "pages.css", "playground.js"):
                        response = await client.get(f"/static/{asset}")
                        if response.status_code != 200:
                            failures.append(f"GET /static/{asset}: {response.status_code}")
                    continue
                target = fill(path, world)
                for role in ROLES:
                    client.cookies = httpx.Cookies(csrf)
                    if role != "anonymous":
                        session = await sessions.start(pg_pool, world.user_ids[role], 600)
                        client.cookies.set(sessions.COOKIE, session)
                    if method == "GET":
                        response = await client.get(target)
                    else:
                        data = {"csrf_token": token.group(1), **_FORM}
                        response = await client.request(method, target, data=data)
                    got: int | str = response.status_code
                    if got == 303 and response.headers["location"].startswith("/login?next="):
                        got = LOGIN
                    want = expected(role, method, path)
                    if got not in want:
                        failures.append(f"{role} {method} {target}: got {got}, want {want}")
                    for header in ("content-security-policy", "x-frame-options", "referrer-policy"):
                        if header not in response.headers:
                            failures.append(f"{role} {method} {target}: no {header}")
    assert failures == [], "\n".join(failures)
