"""Single-use email links (verify an address, reset a password, join a team).

The link carries a random token; Postgres keeps only its SHA-256, its purpose and an
expiry. Consuming marks it used in the same statement that checks it, so a link works
once even when clicked twice at the same moment.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Purpose = Literal["verify", "reset", "invite"]


@dataclass(frozen=True)
class EmailToken:
    """What a valid link stands for."""

    purpose: str
    email: str
    user_id: int | None
    team_id: int | None
    expires_at: datetime


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def issue(
    db: Any,
    purpose: Purpose,
    email: str,
    ttl_s: int,
    *,
    user_id: int | None = None,
    team_id: int | None = None,
    invited_by: int | None = None,
) -> str:
    """A new link token for ``purpose``; returns the token (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    await db.execute(
        """
        INSERT INTO email_tokens (token_hash, purpose, email, user_id, team_id, invited_by,
                                  expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
        """,
        _digest(token),
        purpose,
        email,
        user_id,
        team_id,
        invited_by,
        float(ttl_s),
    )
    return token


_COLUMNS = "purpose, email, user_id, team_id, expires_at"


async def peek(db: Any, purpose: Purpose, token: str) -> EmailToken | None:
    """The unused, unexpired token ``token`` of ``purpose``, without using it up."""
    row = await db.fetchrow(
        f"SELECT {_COLUMNS} FROM email_tokens WHERE token_hash = $1 AND purpose = $2 "
        "AND used_at IS NULL AND expires_at > now()",
        _digest(token),
        purpose,
    )
    return None if row is None else EmailToken(*row)


async def consume(db: Any, purpose: Purpose, token: str) -> EmailToken | None:
    """Use up ``token``; None when it is unknown, used, expired or for another purpose."""
    row = await db.fetchrow(
        f"UPDATE email_tokens SET used_at = now() WHERE token_hash = $1 AND purpose = $2 "
        f"AND used_at IS NULL AND expires_at > now() RETURNING {_COLUMNS}",
        _digest(token),
        purpose,
    )
    return None if row is None else EmailToken(*row)


async def issued_recently(db: Any, purpose: Purpose, email: str, within_s: float) -> int:
    """How many ``purpose`` links went to ``email`` in the last ``within_s`` seconds."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM email_tokens WHERE email = $1 AND purpose = $2 "
            "AND created_at > now() - make_interval(secs => $3)",
            email,
            purpose,
            float(within_s),
        )
    )


async def pending_invites(db: Any, team_id: int) -> list[tuple[str, datetime]]:
    """(email, expiry) of the team's open invitations, newest first."""
    rows = await db.fetch(
        "SELECT email, expires_at FROM email_tokens WHERE team_id = $1 AND purpose = 'invite' "
        "AND used_at IS NULL AND expires_at > now() ORDER BY created_at DESC",
        team_id,
    )
    return [(r[0], r[1]) for r in rows]
