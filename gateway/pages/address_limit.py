"""Requests per client address on the forms that cost a password hash: sign-in, sign-up and
password reset.

Each costs an Argon2id hash (~230 ms of a core), so without a cap one address could keep a
replica's cores busy and slow every API request it proxies. A fixed window per (scope,
address), counted in Postgres in one statement, so every replica sees the same count.
"""

from __future__ import annotations

from typing import Any

_HIT = """
INSERT INTO address_hits AS h (scope, client, window_start, hits) VALUES ($1, $2, now(), 1)
ON CONFLICT (scope, client) DO UPDATE SET
    window_start = CASE WHEN h.window_start <= now() - make_interval(secs => $3)
                        THEN now() ELSE h.window_start END,
    hits = CASE WHEN h.window_start <= now() - make_interval(secs => $3)
                THEN 1 ELSE h.hits + 1 END
RETURNING hits, extract(epoch FROM h.window_start + make_interval(secs => $3) - now())::float8
"""


async def hit(db: Any, scope: str, client: str, limit: int, window_s: float) -> float:
    """Count one request of ``client`` in ``scope``: 0 when within ``limit`` per
    ``window_s``, else the seconds until the window ends."""
    hits, left = await db.fetchrow(_HIT, scope, client, window_s)
    return 0.0 if hits <= limit else max(left, 1.0)
