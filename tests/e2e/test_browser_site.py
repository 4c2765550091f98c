"""The site in a real browser (Playwright driving Debian's Chromium) on real processes.

The public site's playground chats with the free tier of a real ``kvgate gateway`` routing
to the real built-in worker (``kvgate agent -- kvgate worker --model tiny-random``, tiers
on, the NAS a temporary directory, the ledger in the session Postgres); the second turn
shows prompt tokens served from the cache. A visitor's contact form becomes a lead that a
staff member (made with ``kvgate admin users create --staff``) finds in /admin, moves on,
annotates and exports; a signed-in non-staff user gets 404 from every /admin page. After
a multi-turn conversation, /admin/workers shows the worker and bytes on the NAS tier.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from starlette.routing import Route

from gateway.app import build_app
from gateway.config import GatewayConfig
from kvgate.stack.ports import free_port
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, PHONE, needs_chromium
from tests.support.gateway import KVGATE, gateway_env, process, unique
from tests.support.worker import tiny_pool_bytes

pytestmark = needs_chromium

MODEL = "tiny-random"
PASSWORD = "staff-password-1"
#: per-million-token prices the gateway is configured with (the pricing page must show them)
PRICES = {
    "KVGATE_PRICE_INPUT": "0.8",
    "KVGATE_PRICE_CACHED_INPUT": "0.08",
    "KVGATE_PRICE_OUTPUT": "3.2",
}
BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
DESKTOP = {"width": 1280, "height": 800}
#: what sticks out of the viewport: the page itself, or any table (or its scroll box)
_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width) out.push('page');
  for (const table of document.querySelectorAll('table')) {
    const box = (table.closest('.scroll') || table).getBoundingClientRect();
    if (box.left < 0 || box.right > width) out.push(table.id || table.className || 'table');
  }
  return out;
}"""
#: 40 pages of tiny-random KV (16 tokens each): a few prompts fill it, so finished
#: conversations are evicted down the tiers (host RAM, then the NAS).
KV_POOL_BYTES = tiny_pool_bytes(40)


@pytest.fixture(scope="module")
def stack(
    pg_dsn: str, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Path]]:
    """A gateway and a registered tiny-random worker with tiers: (gateway URL, worker id,
    directory of their logs)."""
    logs = tmp_path_factory.mktemp("site-stack")
    nas = logs / "nas"
    nas.mkdir()
    worker_id = unique("w-site")
    port, gw_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gw_port}"
    worker_env = {
        "DATABASE_URL": pg_dsn,
        # tiny-random borrows SmolLM2's tokenizer: use the test cache it was downloaded to.
        "KVGATE_HOME": str(smollm2_gguf.parent.parent),
        "KVGATE_NAS_PATH": str(nas),
    }
    agent = [*KVGATE, "agent", "--url", f"http://127.0.0.1:{port}", "--model", MODEL]
    agent += ["--worker-id", worker_id, "--heartbeat", "0.5", "--"]
    agent += [*KVGATE, "worker", "--model", MODEL, "--port", str(port)]
    agent += ["--kv-pool-bytes", str(KV_POOL_BYTES), "--page-size", "16"]
    env = gateway_env(
        pg_dsn,
        KVGATE_PUBLIC_BASE_URL=url,
        KVGATE_SESSION_SECRET="browser-site-secret",
        KVGATE_GATEWAY_WORKER_TIMEOUT_S="5",
        KVGATE_GATEWAY_USAGE_FLUSH_S="0.2",
        **PRICES,
    )
    gateway = [*KVGATE, "gateway", "--port", str(gw_port)]
    with (
        # The agent's torch worker may take a while to stop; it must not be orphaned.
        process(agent, "", worker_env, wait=False, log=logs / "worker.log", stop_s=60),
        process(gateway, url + "/readyz", env, 60, log=logs / "gateway.log", stop_s=60),
    ):
        try:
            _wait_for_model(url, 240)
            yield url, worker_id, logs
        except BaseException:
            for name in ("worker.log", "gateway.log"):
                print(f"--- {name} ---\n{(logs / name).read_text(errors='replace')[-8000:]}")
            raise


def _wait_for_model(url: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            models = httpx.get(url + "/v1/models", timeout=2).json()["data"]
            if any(m["id"] == MODEL for m in models):
                return
        time.sleep(0.2)  # polling interval while torch loads and the agent registers
    raise TimeoutError(f"no worker serves {MODEL} within {deadline_s}s")


def _create_user(pg_dsn: str, email: str, *flags: str) -> None:
    """`kvgate admin users create` as an operator runs it."""
    done = subprocess.run(
        [*KVGATE, "admin", "users", "create", email, "--password", PASSWORD, *flags],
        env={**os.environ, "DATABASE_URL": pg_dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "created user" in done.stdout


@contextlib.asynccontextmanager
async def _browser() -> Iterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def _log_in(page: Page, url: str, email: str, target: str) -> None:
    await page.goto(f"{url}/login?next={target}")
    await page.fill("input[name=email]", email)
    await page.fill("input[name=password]", PASSWORD)
    await page.click("button[type=submit]")


async def _say(page: Page, text: str, turn: int) -> None:
    await page.fill("#prompt", text)
    await page.click("#send")
    answer = page.locator("#transcript .assistant").nth(turn)
    await expect(answer).to_have_attribute("data-done", "1", timeout=120_000)


async def test_playground_streams_from_the_free_tier_and_shows_cached_tokens(
    stack: tuple[str, str, Path],
) -> None:
    url, _, _ = stack
    async with _browser() as browser:
        page = await browser.new_page(viewport=PHONE)
        chunks: list[int] = []
        page.on(
            "response",
            lambda r: chunks.append(1) if r.url.endswith("/v1/chat/completions") else None,
        )
        await page.goto(url + "/playground")
        await expect(page.locator("#model option")).to_have_count(1)
        await expect(page.locator("#model")).to_have_value(MODEL)

        # The answer grows on the page while the stream is still open: record every
        # length the assistant's text takes before the turn completes.
        await page.evaluate(
            """() => {
              window.lengths = [];
              new MutationObserver(() => {
                const a = document.querySelector('#transcript .assistant');
                if (a && !a.dataset.done) window.lengths.push(a.textContent.length);
              }).observe(document.getElementById('transcript'),
                         {subtree: true, childList: true, characterData: true});
            }"""
        )
        await _say(page, "Tell me a long story about a lighthouse keeper.", 0)
        # A non-streaming page shows the answer once; a streaming one at least twice. (How
        # many network reads the browser coalesces depends on the machine's load, so the
        # test asks for the least that proves streaming.)
        lengths = sorted(set(await page.evaluate("window.lengths")) - {0})
        assert len(lengths) >= 2, f"the answer did not stream (text lengths seen: {lengths})"
        first_prompt = int(await page.locator("#prompt-tokens").inner_text())
        assert first_prompt > 0

        # Turn two resends the conversation: its start comes from the KV cache.
        await _say(page, "And then?", 1)
        assert int(await page.locator("#prompt-tokens").inner_text()) > first_prompt
        cached = int(await page.locator("#cached-tokens").inner_text())
        assert cached >= 16, f"second turn reused {cached} cached prompt tokens"
        assert await page.locator("#error").inner_text() == ""
        assert len(chunks) == 2
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"]


async def test_contact_form_lead_is_worked_and_exported_by_staff_in_admin(
    pg_dsn: str, stack: tuple[str, str, Path]
) -> None:
    url, _, _ = stack
    staff = f"staff-{uuid.uuid4().hex[:8]}@kvgate.test"
    _create_user(pg_dsn, staff, "--staff")
    lead_email = f"cto-{uuid.uuid4().hex[:8]}@prospect.test"
    company = unique("Prospect Inc")
    async with _browser() as browser:
        visitor = await browser.new_page(viewport=PHONE)
        await visitor.goto(url + "/contact")
        await visitor.fill("input[name=name]", "Grace Hopper")
        await visitor.fill("input[name=email]", lead_email)
        await visitor.fill("input[name=company]", company)
        await visitor.select_option("select[name=team_size]", "201-1000")
        await visitor.select_option("select[name=monthly_tokens]", "100M-1B")
        await visitor.fill("input[name=use_case]", "coding assistants")
        await visitor.fill("textarea[name=message]", "Call me about a pilot.")
        await visitor.click("#contact button[type=submit]")
        await expect(visitor).to_have_url(url + "/contact/thanks")
        await expect(visitor.locator("h1")).to_have_text("Thank you")

        page = await (await browser.new_context(accept_downloads=True)).new_page()
        await _log_in(page, url, staff, "/admin/leads")
        await expect(page).to_have_url(url + "/admin/leads")
        await page.fill("input[name=q]", company)
        await page.click("#filters button[type=submit]")
        rows = page.locator("#leads tbody tr")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text(lead_email)
        await expect(rows.first.locator("td.status")).to_have_text("new")

        await page.click(f"#leads a:text('{company}')")
        await page.select_option("#update select[name=status]", "contacted")
        await page.click("#update button[type=submit]")
        await expect(page.locator("#update select[name=status]")).to_have_value("contacted")
        await page.fill("#note textarea[name=body]", "Spoke to Grace: wants a pilot in Q1.")
        await page.click("#note button[type=submit]")
        await expect(page.locator("#timeline")).to_contain_text("wants a pilot in Q1")
        await expect(page.locator("#timeline")).to_contain_text(staff)

        await page.goto(f"{url}/admin/leads?q={company}")
        await expect(page.locator("#leads td.status")).to_have_text("contacted")
        async with page.expect_download() as download_info:
            await page.click("#export")
        download = await download_info.value
        exported = list(csv.DictReader(io.StringIO(Path(await download.path()).read_text())))
        assert [(r["email"], r["company"], r["status"]) for r in exported] == [
            (lead_email, company, "contacted")
        ]

        await page.goto(url + "/admin/audit")
        audit = await page.locator("table.audit").inner_text()
        assert "lead.update" in audit and "lead.note" in audit and "leads.export" in audit


def _admin_pages() -> list[str]:
    """Every GET route under /admin, from the application's own route table."""
    app = build_app(GatewayConfig(dsn="unused: only the route table is read"))
    paths = [
        r.path
        for r in app.routes
        if isinstance(r, Route) and r.path.startswith("/admin") and "GET" in (r.methods or ())
    ]
    return [re.sub(r"\{\w+:int\}", "1", p) for p in paths]


async def test_a_signed_in_non_staff_user_gets_404_on_every_admin_page(
    pg_dsn: str, stack: tuple[str, str, Path]
) -> None:
    url, _, _ = stack
    email = f"customer-{uuid.uuid4().hex[:8]}@example.com"
    _create_user(pg_dsn, email)
    pages = _admin_pages()
    assert len(pages) >= 8
    async with _browser() as browser:
        page = await browser.new_page(viewport=PHONE)
        await _log_in(page, url, email, "/console")
        await expect(page).to_have_url(re.compile(r"/console$"))
        for path in pages:
            response = await page.goto(url + path)
            assert response is not None and response.status == 404, (path, response)
            assert "Leads" not in await page.content()


async def test_workers_page_shows_the_worker_and_nas_bytes_after_a_conversation(
    pg_dsn: str, pg_pool: asyncpg.Pool, stack: tuple[str, str, Path]
) -> None:
    url, worker_id, _ = stack
    staff = f"ops-{uuid.uuid4().hex[:8]}@kvgate.test"
    _create_user(pg_dsn, staff, "--staff")
    # A multi-turn conversation, then other clients' long prompts that push it out of the
    # worker's small KV pool: its pages go to host RAM and are written behind to the NAS.
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        messages = [{"role": "user", "content": "Plan a week of meals for a family of four."}]
        for turn in range(3):
            body = {"model": MODEL, "messages": messages, "max_tokens": 24}
            reply = await client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            messages += [
                reply.json()["choices"][0]["message"],
                {"role": "user", "content": f"Now change day {turn + 2}."},
            ]
        for i in range(4):
            prompt = " ".join(f"filler{i}-{n}" for n in range(120))
            reply = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
                headers={"x-forwarded-for": f"10.99.{i}.7"},  # other free-tier clients
            )
            assert reply.status_code == 200, reply.text
    # the gateway kept the worker's split of every answer's cached tokens by tier (the
    # console's usage by tier); the conversation's later turns had some
    split = await pg_pool.fetch(
        "SELECT cached_tokens, cached_device_tokens + cached_host_tokens + cached_nas_tokens "
        "+ cached_object_tokens FROM usage WHERE worker = $1",
        worker_id,
    )
    assert split and all(cached == tiers for cached, tiers in split)
    assert sum(cached for cached, _ in split) > 0
    async with _browser() as browser:
        page = await browser.new_page()
        await _log_in(page, url, staff, "/admin/workers")
        await expect(page).to_have_url(url + "/admin/workers")
        deadline = time.monotonic() + 60
        while True:
            row = page.locator("#workers tr", has_text=worker_id)
            nas = page.locator("#ledger tr[data-tier=nas]")
            ledger_bytes = int(await nas.get_attribute("data-bytes") or 0)
            if await row.count() == 1 and ledger_bytes > 0:
                break
            assert time.monotonic() < deadline, "no NAS bytes in the ledger after 60 s"
            await page.reload()  # the write-behind is asynchronous: look again
        await expect(row).to_contain_text(MODEL)
        await expect(row).to_contain_text("healthy")
        worker_nas = page.locator("#tiers tr[data-tier=nas]")
        assert int(await worker_nas.get_attribute("data-written") or 0) > 0
        assert await page.locator("svg.chart").count() == 2


def _proof_figures() -> tuple[dict[str, object], list[float]]:
    """The multi-turn report the landing page leads with (of the full and the quick CPU runs,
    the latest by its recorded date) and its restore TTFTs at the longest history, in the
    ladder's order."""
    runs = [
        json.loads(path.read_text())
        for path in (BENCHMARKS / "multiturn.json", BENCHMARKS / "multiturn_quick.json")
        if path.exists()
    ]
    data = max(runs, key=lambda run: run.get("date", ""))
    restore = data["restore"][max(data["restore"], key=int)]
    places = ("resident", "host", "nas", "object", "recompute")
    return data, [restore[p]["ttft"] for p in places if p in restore and not restore[p]["error"]]


async def test_landing_benchmarks_and_pricing_at_desktop_and_phone_widths(
    stack: tuple[str, str, Path],
) -> None:
    url, _, _ = stack
    data, ttfts = _proof_figures()
    async with _browser() as browser:
        page = await browser.new_page()
        for viewport in (DESKTOP, PHONE):
            await page.set_viewport_size(viewport)
            for path in ("/benchmarks", "/pricing", "/"):
                await page.goto(url + path)
                assert await page.evaluate(_OVERFLOW) == [], (path, viewport)
            # the landing page's chart: drawn, inside the viewport, the report's figures
            chart = page.locator("#proof svg.hbars").first
            box = await chart.bounding_box()
            assert box is not None and box["width"] > 200
            assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]
            drawn = await chart.locator("rect").evaluate_all(
                "bars => bars.map(b => Number(b.dataset.value))"
            )
            assert drawn == ttfts
            provenance = await page.locator("#provenance").inner_text()
            assert str(data["model"]) in provenance

        # per-token prices as configured, and the estimator against a sum done by hand
        await page.goto(url + "/pricing")
        team = page.locator("#token-prices tr[data-plan=team] td")
        assert await team.all_inner_texts() == ["$0.80", "$0.08", "$3.20"]
        for name, value in {
            "turns": "4",
            "history": "500",
            "message": "50",
            "answer": "100",
        }.items():
            await page.fill(f"#estimate-form input[name={name}]", value)
        await page.click("#estimate-form button[type=submit]")
        # prompts 550 + 700 + 850 + 1000 = 3100 input tokens, of which 650 + 800 + 950 = 2400
        # come from the cache on turns 2-4; 400 output tokens. With the cache:
        # 700 x $0.80 + 2400 x $0.08 + 400 x $3.20 per million = $0.002032 a conversation
        await expect(page.locator("#cached-tokens")).to_have_text("2,400")
        await expect(page.locator("#cost-with")).to_have_text("$0.0020")
        await expect(page.locator("#cost-1000")).to_have_text("$2.03")
        # without: 3100 x $0.80 + 400 x $3.20 per million = $0.00376
        await expect(page.locator("#cost-without")).to_have_text("$0.0038")
