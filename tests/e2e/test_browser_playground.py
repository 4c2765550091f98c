"""The playground in a real browser (Playwright driving Debian's Chromium) against a real
gateway and a real tiered worker (tiny random model; host RAM, a NAS directory and the
ledger below its device pool; :mod:`tests.support.playground`).

A visitor sends a turn, sends the conversation to the NAS with the page's control, sends
the next turn, and sees that turn's cached tokens reported from the NAS, with its time to
first token and what recomputing them would have cost at the worker's prefill rate.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
from playwright.async_api import Page, async_playwright, expect

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.support.playground import playground_stack
from tests.support.worker import MODEL

pytestmark = needs_chromium

DESKTOP = {"width": 1280, "height": 900}


async def _say(page: Page, text: str, turn: int) -> None:
    await page.fill("#prompt", text)
    await page.click("#send")
    answer = page.locator("#transcript .assistant").nth(turn)
    await expect(answer).to_have_attribute("data-done", "1", timeout=60_000)


async def test_a_conversation_sent_to_the_nas_comes_back_from_the_nas(
    pg_dsn: str, pg_pool: asyncpg.Pool, smollm2_gguf: Path, nas_dir: Path
) -> None:
    async with (
        playground_stack(pg_dsn, pg_pool, nas_dir, smollm2_gguf) as url,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport=DESKTOP)
            await page.goto(url + "/playground")
            await expect(page.locator(f"#model option[value='{MODEL}']")).to_have_count(1)
            await page.select_option("#model", MODEL)

            await _say(page, "Tell me a long story about a lighthouse keeper and the sea.", 0)
            rows = page.locator("#turns tbody tr")
            await expect(rows).to_have_count(1)
            first = rows.nth(0).locator("td")
            await expect(first.nth(1)).to_have_text(re.compile(r"^\d+(\.\d+)? (ms|s)$"))
            await expect(first.nth(2)).to_contain_text("none")  # a first turn has no cache

            await page.select_option("#cold-tier", "nas")
            await page.click("#cold-send")
            status = page.locator("#cold-status")
            await expect(status).to_have_attribute("data-tier", "nas")
            await expect(status).to_contain_text("to the NAS")
            assert list(nas_dir.rglob("*")), "nothing was written to the NAS"

            await _say(page, "And then what happened?", 1)
            await expect(rows).to_have_count(2)
            second = rows.nth(1)
            from_nas = second.locator("[data-tier=nas]")
            await expect(from_nas).to_have_text(re.compile(r"^NAS \d+$"))
            assert int((await from_nas.inner_text()).split()[1]) >= 16
            await expect(second.locator("[data-tier=device]")).to_have_count(0)
            await expect(second.locator("[data-tier=host]")).to_have_count(0)
            await expect(second.locator("td.recompute")).to_contain_text("tokens/s")
            assert await page.locator("#error").inner_text() == ""
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= DESKTOP["width"]
        finally:
            await browser.close()
