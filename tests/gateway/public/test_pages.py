"""The public pages: figures from the benchmark reports, pricing from the plans table, API
docs with working-looking examples, the playground shell, and security headers."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import asyncpg

from gateway.pages.headers import CSP
from gateway.public import figures
from tests.support.accounts import browser
from tests.support.site import site_app

REPORT = """# Tier restore speed

Some words.

| tier | restore GB/s |
|---|---:|
| host | 13.65 |
| nas | 0.66 |

| second | table |
|---|---|
| not | shown |
"""


async def test_landing_shows_the_measured_figures_when_reports_exist(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "tiers.md").write_text(REPORT)
    (tmp_path / "gateway.json").write_text('{"rps_stream": 205.6, "note": "x", "ok": true}')
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path)) as client:
        html = (await client.get("/")).text
    assert "Tier restore speed" in html and "13.65" in html and "0.66" in html
    assert "not" not in re.findall(r"<td>(\w+)</td>", html)  # only the first table
    assert "rps_stream" in html and "206" in html
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path / "none")) as client:
        empty = (await client.get("/")).text
    assert 'id="figures"' not in empty and "KV cache" in empty


def test_reports_without_tables_or_numbers_give_no_figures() -> None:
    assert figures.from_markdown("x", "# Title\n\nno table here\n") is None
    assert figures.from_json("x", '{"a": "text"}') is None
    assert figures.from_json("x", "not json") is None
    bench = figures.from_markdown("x", REPORT)
    assert bench is not None and bench.header == ["tier", "restore GB/s"]
    assert bench.rows == [["host", "13.65"], ["nas", "0.66"]]


async def test_pricing_lists_every_plan_from_the_table(pg_pool: asyncpg.Pool) -> None:
    plan = f"enterprise-{uuid.uuid4().hex[:6]}"
    await pg_pool.execute(
        "INSERT INTO plans VALUES ($1, 6000, 9000000, 900000000, 128, 8192, 131072, 99900)", plan
    )
    async with browser(site_app(pg_pool)) as client:
        html = (await client.get("/pricing")).text
    assert plan in html and "$999.00" in html and "9,000,000" in html
    assert "$49.00" in html and ">free<" in html


async def test_docs_show_curl_and_openai_examples_for_this_gateway(pg_pool: asyncpg.Pool) -> None:
    async with browser(site_app(pg_pool)) as client:
        html = (await client.get("/docs")).text
    assert "curl http://console.test/v1/chat/completions" in html
    assert 'OpenAI(base_url="http://console.test/v1"' in html
    assert "cached_tokens" in html


async def test_every_page_carries_the_security_headers_and_no_inline_script(
    pg_pool: asyncpg.Pool,
) -> None:
    async with browser(site_app(pg_pool)) as client:
        for path in ("/", "/pricing", "/docs", "/playground", "/contact", "/login"):
            response = await client.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-security-policy"] == CSP
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["referrer-policy"] == "strict-origin-when-cross-origin"
            assert response.headers["x-content-type-options"] == "nosniff"
            # The CSP forbids inline script and style: the pages must not need any.
            assert not re.search(r"<script(?![^>]*\bsrc=)", response.text), path
            assert " style=" not in response.text and "<style" not in response.text, path
    assert "frame-ancestors 'none'" in CSP and "script-src 'self'" in CSP
