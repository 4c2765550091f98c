"""Slowing password guessing: after N failed logins in a row, each attempt must wait.

The wait doubles with every further failure (capped), per email address and across all
replicas (the counter is in Postgres). It is a delay, not a lockout, so an attacker cannot
keep the owner out for long; a successful login clears the counter.
"""

from __future__ import annotations

from typing import Any

_BASE_WAIT_S = 30.0
_MAX_WAIT_S = 15 * 60.0


def wait_after(failures: int, free_failures: int) -> float:
    """Seconds an attempt must wait after ``failures`` consecutive failures."""
    if failures < free_failures:
        return 0.0
    return min(_BASE_WAIT_S * 2 ** (failures - free_failures), _MAX_WAIT_S)


async def seconds_to_wait(db: Any, email: str, free_failures: int) -> float:
    """How long ``email`` must wait before its next attempt is even checked (0: go ahead)."""
    row = await db.fetchrow(
        "SELECT failures, extract(epoch FROM now() - last_failure)::float8 "
        "FROM login_attempts WHERE email = $1",
        email,
    )
    if row is None:
        return 0.0
    return max(0.0, wait_after(row[0], free_failures) - row[1])


async def failed(db: Any, email: str) -> None:
    """Count one more failure for ``email``."""
    await db.execute(
        "INSERT INTO login_attempts (email, failures) VALUES ($1, 1) ON CONFLICT (email) "
        "DO UPDATE SET failures = login_attempts.failures + 1, last_failure = now()",
        email,
    )


async def succeeded(db: Any, email: str) -> None:
    """Clear the failure count of ``email``."""
    await db.execute("DELETE FROM login_attempts WHERE email = $1", email)
