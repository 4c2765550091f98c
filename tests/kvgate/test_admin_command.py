"""`kvgate admin users create [--staff]`: the only way to make a staff member."""

from __future__ import annotations

import os
import subprocess
import uuid

import asyncpg

from gateway.pages.passwords import verify_password
from tests.support.gateway import KVGATE


def _create(dsn: str, email: str, password: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVGATE, "admin", "users", "create", email, "--password", password, *flags],
        env={**os.environ, "DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_users_create_makes_verified_users_and_staff(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    email = f"Ops-{uuid.uuid4().hex[:8]}@KVGATE.test"
    done = _create(pg_dsn, email, "first-password-1")
    assert done.returncode == 0, done.stderr
    row = await pg_pool.fetchrow("SELECT * FROM users WHERE email = $1", email.lower())
    assert row["verified_at"] is not None and row["is_staff"] is False

    # --staff on an existing user promotes them and leaves their password alone.
    done = _create(pg_dsn, email, "other-password-2", "--staff")
    assert done.returncode == 0 and "kept existing" in done.stdout and "as staff" in done.stdout
    row = await pg_pool.fetchrow("SELECT * FROM users WHERE email = $1", email.lower())
    assert row["is_staff"] is True
    assert await verify_password(row["password_hash"], "first-password-1")

    weak = _create(pg_dsn, f"x-{uuid.uuid4().hex[:8]}@kvgate.test", "short", "--staff")
    assert weak.returncode != 0 and "at least" in weak.stderr
