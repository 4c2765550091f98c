"""``kvgate.wiring.tiering``: which lower tiers a worker's store gets, the ledger, and when
the engine hands its pages down.

The built-in worker takes every configured tier; ``kvgate bench multiturn``'s worker
names its own set. Stores are built but never started, so only Postgres (for the ledger) is real here.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgate.bench.multiturn import worker as bench_worker
from kvgate.settings import Settings
from kvgate.wiring.tiering import build_store, tiered_offload
from workers.engine.kv_pool import KVLayout

S3 = "http://127.0.0.1:9"  # never contacted: the object tier is not started


async def _tiers(
    tmp_path: Path, dsn: str | None, tiers: Collection[str] | None, s3: str | None = None
) -> tuple[set[str], bool]:
    store = await build_store(Settings(home=tmp_path, s3_endpoint=s3), dsn, tiers)
    try:
        return set(store.tiers), store.ledger is not None
    finally:
        await store.close(drain=False)


async def test_by_default_every_configured_tier(tmp_path: Path) -> None:
    assert await _tiers(tmp_path, None, None) == ({"host", "nas"}, False)
    assert await _tiers(tmp_path, None, None, s3=S3) == ({"host", "nas", "object"}, False)


async def test_a_named_set_is_exactly_those_tiers(tmp_path: Path) -> None:
    assert await _tiers(tmp_path, None, {"host"}, s3=S3) == ({"host"}, False)
    assert await _tiers(tmp_path, None, {"object"}, s3=S3) == ({"host", "object"}, False)


async def test_the_ledger_comes_with_a_shared_tier_only(tmp_path: Path, pg_dsn: str) -> None:
    assert await _tiers(tmp_path, pg_dsn, None) == ({"host", "nas"}, True)
    assert await _tiers(tmp_path, pg_dsn, {"host"}) == ({"host"}, False)


async def test_the_object_tier_asked_without_an_endpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="S3 endpoint"):
        await build_store(Settings(home=tmp_path, s3_endpoint=None), None, {"object"})


def test_the_bench_worker_refuses_the_object_tier_without_an_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KVGATE_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVGATE_HOME", str(tmp_path))
    result = CliRunner().invoke(bench_worker.main, ["--tiers", "nas,object", "--port", "1"])
    assert result.exit_code == 2, result.output
    assert "needs an S3 endpoint" in result.output


@pytest.mark.parametrize("through", [True, False])
def test_the_write_policy_comes_from_the_settings(tmp_path: Path, through: bool) -> None:
    settings = Settings(home=tmp_path, tier_write_through=through)
    layout = KVLayout("float16", page_size=16, num_layers=2, num_kv_heads=2, head_dim=16)
    offload = tiered_offload(
        settings, None, tiers={"host"}, model_fingerprint="m", layout=layout,
        compute="float32@cpu",
    )  # fmt: skip
    try:
        assert offload.write_through is through
    finally:
        offload.close()
