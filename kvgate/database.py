"""Resolve which Postgres this process talks to: ``DATABASE_URL`` or the embedded server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from kvgate.services.postgres import database
from kvgate.settings import Settings
from migrations import runner


@contextlib.contextmanager
def settings_database(settings: Settings) -> Iterator[str]:
    """Yield a DSN for ``settings``: its ``database_url``, else the embedded server's."""
    url = settings.database_url.get_secret_value() if settings.database_url else None
    with database(url, settings.pg_dir) as dsn:
        yield dsn


async def migrate_database(dsn: str) -> list[str]:
    """Apply pending migrations on ``dsn`` (safe beside other processes doing the same)."""
    conn = await asyncpg.connect(dsn)
    try:
        return await runner.migrate(conn)
    finally:
        await conn.close()
