"""``kvgate migrate``: apply pending SQL migrations, or show their status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import click

from kvgate.settings import load_settings
from kvgate.wiring.database import settings_database
from migrations import runner


async def _run(dsn: str, show_status: bool, directory: Path) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        if show_status:
            rows = await runner.status(conn, directory)
            for row in rows:
                state = "EDITED " if row.edited else ("applied" if row.applied_at else "pending")
                when = row.applied_at.isoformat(timespec="seconds") if row.applied_at else ""
                click.echo(f"{state}  {row.name}  {when}")
            return 1 if any(r.edited for r in rows) else 0
        applied = await runner.migrate(conn, directory)
        for name in applied:
            click.echo(f"applied  {name}")
        click.echo(f"{len(applied)} migration(s) applied; database is up to date")
        return 0
    finally:
        await conn.close()


@click.command()
@click.option("--status", "show_status", is_flag=True, help="List migrations and exit.")
@click.option(
    "--migrations-dir",
    "directory",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=runner.MIGRATIONS_DIR,
    envvar="KVGATE_MIGRATIONS_DIR",
    hidden=True,  # for tests that need migrations of their own; operators use the packaged ones
)
def migrate(show_status: bool, directory: Path) -> None:
    """Apply pending migrations in order (safe to run from several processes at once)."""
    with settings_database(load_settings()) as dsn:
        try:
            code = asyncio.run(_run(dsn, show_status, directory))
        except runner.MigrationError as exc:
            raise click.ClickException(str(exc)) from exc
    raise SystemExit(code)
