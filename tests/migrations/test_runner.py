"""The migration runner: ordering, exactly-once under concurrency, edited-file detection."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from migrations import runner

Connect = Callable[[], Awaitable[asyncpg.Connection]]


def _write(directory: Path, name: str, sql: str) -> None:
    (directory / name).write_text(sql)


@pytest.fixture
async def scratch_db(pg_dsn: str) -> Connect:
    """Connect to a fresh, empty database on the session server (runner state starts clean)."""
    name = f"mig_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return functools.partial(asyncpg.connect, pg_dsn, database=name)


async def test_applies_in_order_once_and_reports_status(
    scratch_db: Connect, tmp_path: Path
) -> None:
    _write(tmp_path, "0002_b.sql", "INSERT INTO t VALUES (2);")
    _write(tmp_path, "0001_a.sql", "CREATE TABLE t (v int);")
    conn = await scratch_db()
    try:
        assert await runner.migrate(conn, tmp_path) == ["0001_a.sql", "0002_b.sql"]
        assert await runner.migrate(conn, tmp_path) == []
        assert await conn.fetchval("SELECT count(*) FROM t") == 1
        rows = await runner.status(conn, tmp_path)
        assert [(r.name, r.applied_at is not None, r.edited) for r in rows] == [
            ("0001_a.sql", True, False),
            ("0002_b.sql", True, False),
        ]
    finally:
        await conn.close()


async def test_concurrent_runners_apply_each_file_exactly_once(
    scratch_db: Connect, tmp_path: Path
) -> None:
    _write(tmp_path, "0001_a.sql", "CREATE TABLE hits (v int);")
    _write(tmp_path, "0002_b.sql", "INSERT INTO hits VALUES (1); SELECT pg_sleep(0.2);")
    conns = [await scratch_db() for _ in range(4)]
    try:
        results = await asyncio.gather(*(runner.migrate(c, tmp_path) for c in conns))
        applied = sorted(name for r in results for name in r)
        assert applied == ["0001_a.sql", "0002_b.sql"]
        assert await conns[0].fetchval("SELECT count(*) FROM hits") == 1
        assert await conns[0].fetchval("SELECT count(*) FROM schema_migrations") == 2
    finally:
        for c in conns:
            await c.close()


async def test_edited_migration_is_refused_by_name(scratch_db: Connect, tmp_path: Path) -> None:
    _write(tmp_path, "0001_a.sql", "CREATE TABLE e (v int);")
    conn = await scratch_db()
    try:
        await runner.migrate(conn, tmp_path)
        _write(tmp_path, "0001_a.sql", "CREATE TABLE e (v bigint);")
        with pytest.raises(runner.MigrationError, match=r"0001_a\.sql was edited"):
            await runner.migrate(conn, tmp_path)
        assert [r.edited for r in await runner.status(conn, tmp_path)] == [True]
    finally:
        await conn.close()


async def test_failing_migration_rolls_back_and_is_not_recorded(
    scratch_db: Connect, tmp_path: Path
) -> None:
    _write(tmp_path, "0001_a.sql", "CREATE TABLE f (v int); SELECT no_such_function();")
    conn = await scratch_db()
    try:
        with pytest.raises(asyncpg.PostgresError):
            await runner.migrate(conn, tmp_path)
        assert await conn.fetchval("SELECT to_regclass('f')") is None
        assert [r.applied_at for r in await runner.status(conn, tmp_path)] == [None]
    finally:
        await conn.close()


def test_badly_named_file_is_rejected(tmp_path: Path) -> None:
    _write(tmp_path, "1_x.sql", "SELECT 1;")
    with pytest.raises(runner.MigrationError, match=r"NNNN_name\.sql"):
        runner.discover(tmp_path)
