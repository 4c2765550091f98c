"""Apply the numbered SQL files in this folder, in order, exactly once each.

Every file runs in its own transaction while the runner holds a Postgres advisory lock, so
any number of processes may start at once: the first applies what is pending, the others
wait on the lock, then find nothing left to do. Each applied file is recorded with its
SHA-256; a file edited after it was applied stops the runner with a message naming it,
because silently diverging schemas are worse than a refusal to start.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).parent
_LOCK_KEY = 0x6B7667617465  # "kvgate": one advisory lock id for every runner
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class MigrationError(RuntimeError):
    """The database and the migration files disagree; the message says how to fix it."""


@dataclass(frozen=True)
class Migration:
    """One SQL file: its name (``0001_accounts.sql``), text and checksum."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    """Whether one migration file is applied, and when."""

    name: str
    applied_at: datetime | None
    edited: bool


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in ``directory``, ordered by number; rejects duplicate numbers."""
    found: dict[str, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files must be named NNNN_name.sql")
        number = match.group(1)
        if number in found:
            raise MigrationError(f"{path.name} and {found[number].name} share number {number}")
        found[number] = Migration(path.name, path.read_text())
    return [found[k] for k in sorted(found)]


_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def _applied(conn: asyncpg.Connection) -> dict[str, tuple[str, datetime]]:
    rows = await conn.fetch("SELECT name, checksum, applied_at FROM schema_migrations")
    return {r["name"]: (r["checksum"], r["applied_at"]) for r in rows}


def _check_unedited(files: list[Migration], applied: dict[str, tuple[str, datetime]]) -> None:
    for m in files:
        if m.name in applied and applied[m.name][0] != m.checksum:
            raise MigrationError(
                f"migration {m.name} was edited after it was applied "
                f"(recorded sha256 {applied[m.name][0][:12]}…, file now {m.checksum[:12]}…); "
                "restore the original file and put the change in a new migration"
            )


async def migrate(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply every pending migration; return the names applied by this call."""
    files = discover(directory)
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        applied = await _applied(conn)
        _check_unedited(files, applied)
        done: list[str] = []
        for m in files:
            if m.name in applied:
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                    m.name,
                    m.checksum,
                )
            done.append(m.name)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def status(
    conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR
) -> list[MigrationStatus]:
    """Every migration file with its applied time (None when pending) and whether it was edited."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    applied = await _applied(conn) if exists else {}
    return [
        MigrationStatus(
            m.name,
            applied[m.name][1] if m.name in applied else None,
            m.name in applied and applied[m.name][0] != m.checksum,
        )
        for m in discover(directory)
    ]
