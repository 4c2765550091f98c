"""Resolve which Postgres this process talks to: ``DATABASE_URL`` or the embedded server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg

from kvgate.settings import Settings
from kvgate.stack.postgres import database
from migrations import runner

T = TypeVar("T")


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


def run_on_database(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run ``work`` on one connection to ``settings``' migrated database; return its result.

    The connection, and an embedded server started for it, are closed afterwards. For
    one-shot commands (``kvgate admin``, ``kvgate billing``) that need the schema current
    but no pool and no event loop of their own.
    """

    async def run(dsn: str) -> T:
        conn = await asyncpg.connect(dsn)
        try:
            await runner.migrate(conn)
            return await work(conn)
        finally:
            await conn.close()

    with settings_database(settings) as dsn:
        return asyncio.run(run(dsn))
