"""``kvgate bench tiers --quick --json``: every figure the report states, from a run.

The plan is shrunk so that the run takes seconds; the speeds are whatever this machine
gives (benchmarks, not tests, judge them), but every figure must be there, consistent and
measured: a ratio is its restore over its raw speed, and the chain lookup found its pages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgate.bench import tiers as bench_tiers
from kvgate.stack.seaweed import S3Endpoint


def test_quick_run_writes_every_tier_and_the_ledger(
    tmp_path: Path, pg_dsn: str, s3_server: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        bench_tiers, "QUICK", bench_tiers.Plan(pages=8, reps=1, ledger_rows=5000, lookups=20)
    )
    env = {
        "DATABASE_URL": pg_dsn,
        "KVGATE_S3_ENDPOINT": s3_server.url,
        "KVGATE_S3_ACCESS_KEY": s3_server.access_key,
        "KVGATE_S3_SECRET_KEY": s3_server.secret_key,
        "KVGATE_S3_REGION": s3_server.region,
        "KVGATE_S3_BUCKET": "kvtest",
        "KVGATE_HOME": str(tmp_path / "home"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # where a report would land (docs/benchmarks/)
    out = tmp_path / "tiers.json"
    result = CliRunner().invoke(bench_tiers.tiers, ["--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert {"host", "nas", "object", "ledger"} <= data.keys()
    for tier in ("host", "nas", "object"):
        fig = data[tier]
        assert fig["restore_gbps"] > 0 and fig["raw_gbps"] > 0
        assert fig["ratio"] == pytest.approx(fig["restore_gbps"] / fig["raw_gbps"])
    for tier in ("nas", "object"):  # raw reads then the same copy, for comparison
        assert data[tier]["ratio_like_for_like"] == pytest.approx(
            data[tier]["restore_gbps"] / data[tier]["raw_into_gbps"]
        )
    assert "raw_into_gbps" not in data["host"]  # for RAM, reading is the copy
    assert data["ledger"]["upserts_per_s"] > 0
    assert 0 < data["ledger"]["lookup_p50_ms"] <= data["ledger"]["lookup_p99_ms"]
    assert not (tmp_path / "docs").exists()  # --quick writes no report unless asked
