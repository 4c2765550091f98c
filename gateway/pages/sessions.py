"""Browser sessions: a random cookie value, stored in Postgres only as its SHA-256.

Sessions live in the database rather than in a signed cookie so that logout, a password
reset and a removed membership take effect at once on every replica.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

COOKIE = "kvg_session"


@dataclass(frozen=True)
class SessionUser:
    """The signed-in user behind a session cookie."""

    id: int
    email: str


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def start(db: Any, user_id: int, ttl_s: int) -> str:
    """A new session for ``user_id``; returns the cookie value (never stored)."""
    token = secrets.token_urlsafe(32)
    await db.execute(
        "INSERT INTO sessions (token_hash, user_id, expires_at) "
        "VALUES ($1, $2, now() + make_interval(secs => $3))",
        _digest(token),
        user_id,
        float(ttl_s),
    )
    return token


async def user_for(db: Any, token: str | None) -> SessionUser | None:
    """The user of a live session ``token``; None when absent, unknown or expired."""
    if not token:
        return None
    row = await db.fetchrow(
        "SELECT u.id, u.email FROM sessions s JOIN users u ON u.id = s.user_id "
        "WHERE s.token_hash = $1 AND s.expires_at > now() AND u.verified_at IS NOT NULL",
        _digest(token),
    )
    return None if row is None else SessionUser(row[0], row[1])


async def end(db: Any, token: str | None) -> None:
    """Forget session ``token`` (logout)."""
    if token:
        await db.execute("DELETE FROM sessions WHERE token_hash = $1", _digest(token))


async def end_all(db: Any, user_id: int) -> None:
    """Forget every session of ``user_id`` (after a password reset)."""
    await db.execute("DELETE FROM sessions WHERE user_id = $1", user_id)


def set_cookie(response: Response, token: str, ttl_s: int, secure: bool) -> None:
    """Attach the session cookie: unreadable by scripts, not sent on cross-site posts."""
    response.set_cookie(
        COOKIE, token, max_age=ttl_s, httponly=True, samesite="lax", secure=secure, path="/"
    )


def clear_cookie(response: Response, secure: bool) -> None:
    """Remove the session cookie from the browser."""
    response.delete_cookie(COOKIE, httponly=True, samesite="lax", secure=secure, path="/")
