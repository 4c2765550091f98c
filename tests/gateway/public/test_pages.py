"""The public pages: the landing's proof and every report in full from the benchmarks,
pricing from the plans table, API docs with working-looking examples, the playground shell,
and security headers."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import asyncpg

from gateway.pages.headers import CSP
from gateway.public import figures, proof
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


def _multiturn(restore: dict[str, dict[str, float]], **extra: object) -> str:
    """A multi-turn report as ``kvgate bench multiturn`` writes it (the fields the site reads)."""
    return json.dumps(
        {
            "run": "full",
            "machine": {"gpu": None, "cpu": "AMD EPYC", "cpus": 2, "processor": "x86_64"},
            "model": "smollm2-135m-instruct",
            "engine": "float32 on cpu",
            "restore": {
                length: {place: {"ttft": t, "error": ""} for place, t in probes.items()}
                for length, probes in restore.items()
            },
            **extra,
        }
    )


async def test_landing_leads_with_the_restore_figures_of_the_latest_run(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "multiturn_quick.json").write_text(
        _multiturn({"4000": {"resident": 9.0, "recompute": 99.0}})
    )
    (tmp_path / "multiturn.json").write_text(
        _multiturn(
            {
                "1000": {"resident": 0.05, "nas": 0.06, "recompute": 1.2},
                "7000": {"resident": 0.169, "host": 0.22, "nas": 0.227, "recompute": 16.665},
            },
            date="2026-12-02T06:48:37Z",
            efficiency_rps_nas={"value": 0.81, "target": ">= 0.8"},
            figures={"efficiency_rps_host": 0.9, "efficiency_rps_object": None},
        )
    )
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path)) as client:
        html = (await client.get("/")).text
    # the full run, at its longest history, every place in the ladder's order
    assert re.findall(r'<text class="label"[^>]*>([^<]+)</text>', html) == [
        "resident on the GPU", "from host RAM", "from the NAS", "recomputed, no cache",
        "from host RAM", "from the NAS",
    ]  # fmt: skip
    assert re.findall(r'data-value="([^"]+)"', html) == [
        "0.169", "0.22", "0.227", "16.665", "0.9", "0.81",
    ]  # fmt: skip
    assert "7,000-token history" in html and "0.22 s from host RAM" in html
    assert "16.7 s</strong>" in html and ">90%<" in html
    assert "AMD EPYC CPU (2 cores)" in html and "on 2026-12-02." in html
    assert 'id="gpu-note"' not in html and 'id="figures"' not in html
    # a quick run recorded later leads instead
    (tmp_path / "multiturn_quick.json").write_text(
        _multiturn({"4000": {"nas": 0.87, "recompute": 40.9}}, date="2026-12-02T13:57:28Z")
    )
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path)) as client:
        later = (await client.get("/")).text
    assert re.findall(r'data-value="([^"]+)"', later) == ["0.87", "40.9"]
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path / "none")) as client:
        empty = (await client.get("/")).text
    assert 'id="proof"' not in empty and "KV page" in empty


async def _gpu_note(pg_pool: asyncpg.Pool, benchmarks: Path) -> str:
    """The landing page's sentence on the GPU run, whitespace collapsed."""
    async with browser(site_app(pg_pool, benchmarks_dir=benchmarks)) as client:
        html = (await client.get("/")).text
    note = re.search(r'<p id="gpu-note">(.*?)</p>', html, re.S)
    assert note is not None, html
    return " ".join(note.group(1).split())


async def test_landing_explains_a_gpu_run_where_recompute_won(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "multiturn.json").write_text(_multiturn({"4000": {"nas": 0.2, "recompute": 7.0}}))
    (tmp_path / "multiturn_cuda.json").write_text(
        _multiturn(
            {"4000": {"resident": 0.065, "nas": 1.312, "recompute": 0.443}},
            machine={"gpu": "NVIDIA H200", "cpus": 16},
            date="2026-11-29T23:12:33Z",
            physics={
                "prefill_tokens_per_s": {"4000": 9342.4},
                "restore_bytes_per_s": {"nas": {"4000": 433773461.8}, "host": {"4000": 9e8}},
                "break_even_bytes_per_s": 1224525665.1,
            },
        )
    )
    text = await _gpu_note(pg_pool, tmp_path)
    assert text.startswith("On an NVIDIA H200 GPU (16 CPU cores) on 2026-11-29, recompute won")
    assert "0.443 s against 1.31 s from the NAS" in text
    assert "9,342 tokens/s" in text and "1.22 GB/s" in text and "NAS delivered 0.43 GB/s" in text


async def test_landing_states_a_gpu_run_where_a_tier_won(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "multiturn.json").write_text(_multiturn({"4000": {"nas": 0.2, "recompute": 7.0}}))
    gpu = {"resident": 0.078, "host": 0.183, "nas": 0.140, "recompute": 1.113}
    cuda = _multiturn({"4000": gpu}, machine={"gpu": "NVIDIA H200"}, date="2026-12-04T17:50:00Z")
    (tmp_path / "multiturn_cuda.json").write_text(cuda)
    text = await _gpu_note(pg_pool, tmp_path)
    assert text.startswith("On an NVIDIA H200 GPU on 2026-12-04, serving ")
    assert "got its first token in 0.14 s from the NAS against 1.11 s recomputed" in text
    assert text.endswith("and 0.078 s resident.") and "recompute won" not in text


def test_a_report_without_a_recompute_or_with_failed_probes_is_no_proof() -> None:
    assert proof.from_json("x", {"restore": {}}) is None
    assert proof.from_json("x", {"restore": {"4000": {"nas": {"ttft": 1}}}}) is None
    failed = {"recompute": {"ttft": 9.0}, "nas": {"ttft": 0.1, "error": "timed out"}}
    assert proof.from_json("x", {"restore": {"4000": failed}}) is None
    run = proof.from_json("x", json.loads(_multiturn({"10": {"nas": 2, "recompute": 1}})))
    assert run is not None and run.recompute_won and run.day == ""
    odd = {"restore": {"10": {"nas": {"ttft": 2}, "recompute": {"ttft": 1}}}, "machine": "x"}
    odd |= {"physics": [], "figures": "none", "model": "m"}
    run = proof.from_json("x", odd)
    assert run is not None and run.machine == "unknown CPU" and run.efficiency == {}


async def test_benchmarks_page_shows_every_report_in_full(
    pg_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    (tmp_path / "tiers.md").write_text(REPORT + "\n<script>alert(1)</script>\n")
    (tmp_path / "gateway.json").write_text('{"rps_stream": 205.6, "note": "x", "ok": true}')
    async with browser(site_app(pg_pool, benchmarks_dir=tmp_path)) as client:
        html = (await client.get("/benchmarks")).text
    assert '<h2 id="tiers-title">Tier restore speed</h2>' in html
    assert "13.65" in html and ">shown<" in html  # every table, not the first only
    assert (
        html.count('<div class="scroll" tabindex="0"><table>') == 3
    )  # two reports' tables, each boxed
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "rps_stream" in html and "206" in html


def test_reports_without_numbers_give_no_json_figures() -> None:
    assert figures.from_json("x", '{"a": "text"}') is None
    assert figures.from_json("x", "not json") is None
    report = figures.from_markdown("multiturn_quick", "no title, no table\n")
    assert report.title == "Multiturn quick" and "<table>" not in report.html


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
