"""The console in a real browser (Playwright driving Debian's Chromium) on a real gateway.

A new user signs up, follows the verification link from the gateway's log, creates an API
key, calls ``/v1/chat/completions`` with it, and sees the request in the console's usage.
The key's secret must appear in exactly one response (its creation) and nowhere in the
gateway's log or the database. The browser uses a phone-sized window throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
from playwright.async_api import Page, Response, async_playwright, expect

from kvgate.stack.ports import free_port
from tests.support.accounts import PASSWORD
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, PHONE, needs_chromium
from tests.support.gateway import (
    KVGATE,
    deregister,
    gateway_env,
    process,
    register_workers,
    stub_upstream,
    unique,
)

pytestmark = needs_chromium


@contextlib.contextmanager
def gateway_logging_to(dsn: str, log: Path) -> Iterator[str]:
    """A ``kvgate gateway`` process whose output goes to ``log``; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = gateway_env(dsn, KVGATE_PUBLIC_BASE_URL=url, KVGATE_GATEWAY_USAGE_FLUSH_S="0.2")
    with process([*KVGATE, "gateway", "--port", str(port)], url + "/readyz", env, 60, log=log):
        yield url


def link_in_log(log: Path, email: str, deadline_s: float = 10.0) -> str:
    """The verification link mailed to ``email``, once it appears in the gateway's log."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        text = log.read_text(errors="replace")
        at = text.find(f"email to {email} ")
        if at >= 0:
            match = re.search(r"https?://\S+/verify\?token=[\w%-]+", text[at:])
            if match:
                return match.group(0)
        time.sleep(0.05)  # polling interval while the gateway writes its log
    raise AssertionError(f"no verification email for {email} in {log}:\n{log.read_text()[-3000:]}")


async def _database_text(pool: asyncpg.Pool) -> str:
    tables = await pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    rows = []
    for (table,) in tables:
        rows += [r[0] for r in await pool.fetch(f'SELECT t::text FROM "{table}" t')]
    return "\n".join(rows)


async def test_sign_up_verify_create_key_call_and_see_usage(
    pg_dsn: str, pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    model = unique("m-browser")
    worker = unique("w-browser")
    email = f"browser-{uuid.uuid4().hex[:8]}@example.com"
    log = tmp_path / "gateway.log"
    with stub_upstream(worker) as (upstream, _):
        await register_workers(pg_pool, model, {worker: upstream})
        try:
            with gateway_logging_to(pg_dsn, log) as url:
                async with async_playwright() as pw:
                    browser = await pw.chromium.launch(
                        executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                    )
                    try:
                        context = await browser.new_context(viewport=PHONE, is_mobile=True)
                        page = await context.new_page()
                        bodies: list[asyncio.Task[bytes]] = []

                        def keep(response: Response) -> None:
                            if 200 <= response.status < 300:
                                bodies.append(asyncio.ensure_future(response.body()))

                        page.on("response", keep)

                        # Sign up.
                        await page.goto(url + "/signup")
                        await page.fill("input[name=email]", email)
                        await page.fill("input[name=team]", unique("browser-team"))
                        await page.fill("input[name=password]", PASSWORD)
                        await page.click("button[type=submit]")
                        await expect(page.locator("h1")).to_have_text("Check your email")

                        # Verify from the logged email: signed in, on the keys page.
                        await page.goto(link_in_log(log, email))
                        await expect(page).to_have_url(re.compile(r"/console/teams/\d+/keys$"))
                        await _fits_phone(page)

                        # Create a key; the secret is on the page this once.
                        await page.fill("input[name=name]", "from-the-browser")
                        await page.click("text=Create key")
                        secret = (await page.locator("#new-secret").inner_text()).strip()
                        assert secret.startswith("kvg_")

                        # Use it.
                        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                            reply = await client.post(
                                "/v1/chat/completions",
                                headers={"authorization": f"Bearer {secret}"},
                                json={
                                    "model": model,
                                    "max_tokens": 3,
                                    "messages": [{"role": "user", "content": "hello"}],
                                },
                            )
                        assert reply.status_code == 200, reply.text

                        # The request shows up in the console's usage within seconds.
                        usage_url = page.url.replace("/keys", "/usage")
                        deadline = time.monotonic() + 10
                        while True:
                            await page.goto(usage_url)
                            if model in await page.locator("#recent").inner_text():
                                break
                            assert time.monotonic() < deadline, "request not in usage after 10 s"
                        recent = await page.locator("#recent tbody tr").first.inner_text()
                        assert secret[:12] in recent and "200" in recent
                        assert "from-the-browser" in await page.locator("#by-key").inner_text()
                        # requests and tokens per day, cached input by tier
                        assert await page.locator("svg.chart").count() == 3
                        await _fits_phone(page)

                        # Back on the keys page: prefix and last use, never the secret.
                        await page.goto(usage_url.replace("/usage", "/keys"))
                        keys_table = await page.locator("#keys").inner_text()
                        assert secret[:12] in keys_table and "never" not in keys_table
                        seen = [await b for b in bodies]
                    finally:
                        await browser.close()
        finally:
            await deregister(pg_pool, [worker])
    carrying = [b for b in seen if secret.encode() in b]
    assert len(carrying) == 1, f"the secret was in {len(carrying)} responses"
    assert secret not in log.read_text(errors="replace")
    assert secret not in await _database_text(pg_pool)


async def _fits_phone(page: Page) -> None:
    """The page needs no sideways scrolling on a phone (wide tables scroll inside a box)."""
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} is {width}px wide on a {PHONE['width']}px phone"
