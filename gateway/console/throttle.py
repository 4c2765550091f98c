"""Slowing password guessing: after N failed logins in a row, each attempt must wait.

The count is per email address *and* client address, across all replicas (it is in
Postgres): a stranger's wrong passwords slow the stranger, never the owner signing in from
elsewhere (what any one address may try across all emails is capped by the per-address
limit of :mod:`gateway.pages.address_limit`). The wait doubles with every further failure,
capped; a successful login clears the count.

An attempt is counted *before* its password is checked, in the same statement that checks
the wait (:func:`claim`), so concurrent attempts cannot all slip through while the first
ones are still hashing: 40 at once with a limit of 10 check 10 passwords, not 40.
"""

from __future__ import annotations

from typing import Any

_BASE_WAIT_S = 30.0
_MAX_WAIT_S = 15 * 60.0
#: the wait stops doubling after this many failures beyond the free ones (30 s * 2^5 > max)
_MAX_DOUBLINGS = 5

_WAIT_SQL = f"""
CASE WHEN a.failures < $3 THEN 0
     ELSE least({_BASE_WAIT_S} * 2 ^ least(a.failures - $3, {_MAX_DOUBLINGS}), {_MAX_WAIT_S})
END - extract(epoch FROM now() - a.last_failure)
"""

_CLAIM = f"""
INSERT INTO login_attempts AS a (email, client, failures, last_failure) VALUES ($1, $2, 1, now())
ON CONFLICT (email, client) DO UPDATE SET failures = a.failures + 1, last_failure = now()
WHERE ({_WAIT_SQL}) <= 0
RETURNING a.failures
"""

_WAIT = f"SELECT greatest(({_WAIT_SQL})::float8, 1) FROM login_attempts a WHERE email = $1 AND client = $2"


def wait_after(failures: int, free_failures: int) -> float:
    """Seconds an attempt must wait after ``failures`` consecutive failures."""
    if failures < free_failures:
        return 0.0
    return min(_BASE_WAIT_S * 2 ** min(failures - free_failures, _MAX_DOUBLINGS), _MAX_WAIT_S)


async def claim(db: Any, email: str, client: str, free_failures: int) -> float:
    """Count an attempt of ``email`` from ``client`` as failed until it succeeds, if it may
    be made now: returns 0, or the seconds to wait (nothing counted then)."""
    async with db.acquire() as conn:
        if await conn.fetchval(_CLAIM, email, client, free_failures) is not None:
            return 0.0
        wait = await conn.fetchval(_WAIT, email, client, free_failures)
    return 1.0 if wait is None else float(wait)


async def reset(db: Any, email: str) -> None:
    """Clear every count of ``email`` (its owner just proved the address)."""
    await db.execute("DELETE FROM login_attempts WHERE email = $1", email)


async def succeeded(db: Any, email: str, client: str) -> None:
    """Clear the failure count of ``email`` from ``client``."""
    await db.execute("DELETE FROM login_attempts WHERE email = $1 AND client = $2", email, client)
