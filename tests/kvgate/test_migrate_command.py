"""``kvgate migrate`` as separate processes against the real session Postgres."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.support.commands import kvgate_env


@pytest.fixture
async def fresh_db_url(pg_dsn: str) -> str:
    """``DATABASE_URL`` of a new, empty database on the session server."""
    name = f"migcli_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{name}"))


def _migrate(tmp_path: Path, url: str, migrations: Path) -> subprocess.Popen[str]:
    env = kvgate_env(tmp_path / "home", DATABASE_URL=url, KVGATE_MIGRATIONS_DIR=str(migrations))
    return subprocess.Popen(
        [sys.executable, "-m", "kvgate", "migrate"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_two_processes_at_once_both_succeed_and_apply_each_file_once(
    fresh_db_url: str, tmp_path: Path
) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    # the first file holds its transaction open long enough for the processes to overlap
    (migrations / "0001_slow.sql").write_text("CREATE TABLE hits (v int); SELECT pg_sleep(1);")
    (migrations / "0002_insert.sql").write_text("INSERT INTO hits VALUES (1);")
    procs = [_migrate(tmp_path, fresh_db_url, migrations) for _ in range(2)]
    results = [(p.wait(120), *p.communicate()) for p in procs]
    assert [code for code, _out, _err in results] == [0, 0], results
    applied_lines = sorted(
        line
        for _code, out, _err in results
        for line in out.splitlines()
        if line.startswith("applied")
    )
    assert applied_lines == ["applied  0001_slow.sql", "applied  0002_insert.sql"]
    conn = await asyncpg.connect(fresh_db_url)
    try:
        names = [r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")]
        assert sorted(names) == ["0001_slow.sql", "0002_insert.sql"]
        assert await conn.fetchval("SELECT count(*) FROM hits") == 1
    finally:
        await conn.close()


async def test_edited_migration_stops_migrate_naming_the_file(
    fresh_db_url: str, tmp_path: Path
) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_first.sql").write_text("CREATE TABLE edited (v int);")
    proc = _migrate(tmp_path, fresh_db_url, migrations)
    assert proc.wait(60) == 0, proc.communicate()
    (migrations / "0001_first.sql").write_text("CREATE TABLE edited (v bigint);")
    proc = _migrate(tmp_path, fresh_db_url, migrations)
    code = proc.wait(60)
    _out, err = proc.communicate()
    assert code != 0
    assert "migration 0001_first.sql was edited after it was applied" in err
    assert "put the change in a new migration" in err


async def test_the_packaged_migrations_apply_to_an_empty_database(fresh_db_url: str) -> None:
    env = kvgate_env(Path("/nonexistent-kvgate-home"), DATABASE_URL=fresh_db_url)
    cmd = [sys.executable, "-m", "kvgate", "migrate"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    status = subprocess.run([*cmd, "--status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert all(line.startswith("applied") for line in status.stdout.splitlines()), status.stdout
