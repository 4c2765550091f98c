"""Every page of the route crawl passes an axe-core audit in Chromium: no serious or critical
violation.

The pages are the GET routes of the gateway's own route table (``tests/support/crawl.py``),
so a page added later is audited too. Each is opened by the role that sees it: public pages
anonymously, console pages as a team owner, /admin pages as staff, on a real ``kvgate
gateway`` over the session Postgres (the landing page's figures are the checkout's
``docs/benchmarks``). axe-core is the copy ``axe-playwright-python`` ships, injected into
each page through Playwright.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Browser, async_playwright

from gateway.pages import sessions
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, PHONE
from tests.support.crawl import app_routes, fill, make_world
from tests.support.gateway import gateway_process

pytestmark = pytest.mark.usefixtures("chromium")

#: what a page may have and still pass
TOLERATED = ("minor", "moderate")
#: routes that are not pages (machine endpoints, assets, downloads)
NOT_PAGES = ("/v1/", "/static", "/healthz", "/readyz", "/metrics", "/openapi.json")
DOWNLOADS = ".csv"


def _role(path: str) -> str:
    if path.startswith("/admin"):
        return "staff"
    if path.startswith("/console") or path == "/invite":
        return "owner"
    return "anonymous"


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the module."""
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def test_every_page_passes_axe_with_no_serious_or_critical_violation(
    pg_dsn: str, pg_pool: asyncpg.Pool, browser: Browser
) -> None:
    world = await make_world(pg_pool)
    paths = sorted(
        {
            fill(p, world)
            for m, p in app_routes()
            if m == "GET" and not p.startswith(NOT_PAGES) and not p.endswith(DOWNLOADS)
        }
    )
    axe = Axe()
    audited: list[str] = []
    failures: list[str] = []
    with gateway_process(pg_dsn) as (url, _):
        pages = {}
        for role in ("anonymous", "owner", "staff"):
            context = await browser.new_context(viewport=PHONE)
            if role != "anonymous":
                cookie = await sessions.start(pg_pool, world.user_ids[role], 600)
                await context.add_cookies([{"name": sessions.COOKIE, "value": cookie, "url": url}])
            pages[role] = await context.new_page()
        for path in paths:
            page = pages[_role(path)]
            response = await page.goto(url + path)
            assert response is not None, path
            if not response.headers.get("content-type", "").startswith("text/html"):
                continue
            audited.append(path)
            results = await axe.run(page)
            for v in results.response["violations"]:
                if v["impact"] not in TOLERATED:
                    targets = [", ".join(n["target"]) for n in v["nodes"]][:5]
                    failures.append(f"{path}: {v['id']} ({v['impact']}) {v['help']}: {targets}")
    # every public page, the console's four and the staff dashboard's at least
    assert {"/", "/benchmarks", "/pricing", "/playground", "/contact"} <= set(audited)
    assert sum(p.startswith("/console") for p in audited) >= 4
    assert sum(p.startswith("/admin") for p in audited) >= 5
    assert failures == [], "\n".join(failures)
