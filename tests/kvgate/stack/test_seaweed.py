"""The local SeaweedFS runs with a Go memory limit and collector target unless the environment
chose them, and keeps its filer metadata in SQLite unless its data directory already holds a
leveldb2 store."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.stack.seaweed import (
    FILER_DB,
    LEVELDB_DIR,
    WEED_GC_PERCENT,
    WEED_MEMORY_LIMIT,
    weed_env,
)


def test_weed_gets_a_memory_limit_and_gc_target_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    monkeypatch.delenv("GOGC", raising=False)
    env = weed_env(tmp_path)
    assert env["GOMEMLIMIT"] == WEED_MEMORY_LIMIT and env["GOGC"] == WEED_GC_PERCENT
    monkeypatch.setenv("GOMEMLIMIT", "2GiB")
    monkeypatch.setenv("GOGC", "100")
    env = weed_env(tmp_path)
    assert env["GOMEMLIMIT"] == "2GiB" and env["GOGC"] == "100"


def test_a_new_data_directory_keeps_filer_metadata_in_sqlite(tmp_path: Path) -> None:
    (tmp_path / LEVELDB_DIR).mkdir()  # weed makes it empty even when it does not use it
    env = weed_env(tmp_path)
    assert env["WEED_SQLITE_ENABLED"] == "true" and env["WEED_LEVELDB2_ENABLED"] == "false"
    assert env["WEED_SQLITE_DBFILE"] == str(tmp_path.absolute() / FILER_DB)


def test_a_data_directory_with_leveldb2_metadata_keeps_it(tmp_path: Path) -> None:
    (tmp_path / LEVELDB_DIR / "00").mkdir(parents=True)
    assert "WEED_SQLITE_ENABLED" not in weed_env(tmp_path)
    (tmp_path / FILER_DB).touch()  # a store that is SQLite already stays SQLite
    assert weed_env(tmp_path)["WEED_SQLITE_ENABLED"] == "true"
