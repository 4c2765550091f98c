"""People and their teams: users, memberships (owner or member) and sign-up.

A sign-up creates the user, a team of their own on the ``free`` plan (through
``gateway.accounts``, the same code ``kvgate admin`` uses) and the owner membership in
one transaction, so there is never a user without a team or a team without an owner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gateway import accounts

SIGNUP_PLAN = "free"


class SignupError(ValueError):
    """The sign-up cannot go through; the message says what to change."""


@dataclass(frozen=True)
class Credentials:
    """A user as the login form needs it."""

    id: int
    email: str
    password_hash: str
    verified: bool


@dataclass(frozen=True)
class Membership:
    """One user's place in one team."""

    team_id: int
    team: str
    role: str
    plan: str


@dataclass(frozen=True)
class Member:
    """A row of a team's member list."""

    user_id: int
    email: str
    role: str
    since: datetime


def normalize_email(email: str) -> str:
    """The form in which emails are stored and compared."""
    return email.strip().lower()


#: an address mail can go to: a dot-atom local part, a domain of DNS labels, a letter TLD.
#: No spaces, quotes or control characters, so an address can never carry a header line
#: (``a@b.co\r\nBcc: ...``) into a message.
_EMAIL = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}"
)


def is_valid_email(email: str) -> bool:
    """Whether ``email`` is an address we accept for sign-up, invitations and leads."""
    local, _, _ = email.partition("@")
    return len(email) <= 254 and len(local) <= 64 and _EMAIL.fullmatch(email) is not None


async def sign_up(pool: asyncpg.Pool, email: str, password_hash: str, team_name: str) -> int:
    """Create an unverified user owning a new team; returns the user id."""
    async with pool.acquire() as conn, conn.transaction():
        user_id = await conn.fetchval(
            "INSERT INTO users (email, password_hash) VALUES ($1, $2) "
            "ON CONFLICT (email) DO NOTHING RETURNING id",
            email,
            password_hash,
        )
        if user_id is None:
            raise SignupError("An account with this email exists already; log in instead.")
        try:
            team = await accounts.create_team(conn, team_name, SIGNUP_PLAN)
        except accounts.AccountError as exc:
            raise SignupError(f"The team name {team_name!r} is taken; choose another.") from exc
        await add_member(conn, user_id, team.id, "owner")
        return int(user_id)


async def credentials(db: Any, email: str) -> Credentials | None:
    """The user with ``email`` (normalized), or None."""
    row = await db.fetchrow(
        "SELECT id, email, password_hash, verified_at IS NOT NULL FROM users WHERE email = $1",
        email,
    )
    return None if row is None else Credentials(*row)


async def mark_verified(db: Any, user_id: int) -> None:
    """Record that ``user_id`` owns their email address."""
    await db.execute(
        "UPDATE users SET verified_at = coalesce(verified_at, now()) WHERE id = $1", user_id
    )


async def set_password(db: Any, user_id: int, password_hash: str) -> None:
    """Replace the password of ``user_id``."""
    await db.execute("UPDATE users SET password_hash = $2 WHERE id = $1", user_id, password_hash)


async def memberships(db: Any, user_id: int) -> list[Membership]:
    """The teams of ``user_id``, oldest membership first."""
    rows = await db.fetch(
        "SELECT t.id, t.name, m.role, t.plan FROM memberships m JOIN teams t ON t.id = m.team_id "
        "WHERE m.user_id = $1 ORDER BY m.created_at, t.id",
        user_id,
    )
    return [Membership(*r) for r in rows]


async def membership(db: Any, user_id: int, team_id: int) -> Membership | None:
    """The membership of ``user_id`` in ``team_id``, or None when they are not in it."""
    row = await db.fetchrow(
        "SELECT t.id, t.name, m.role, t.plan FROM memberships m JOIN teams t ON t.id = m.team_id "
        "WHERE m.user_id = $1 AND m.team_id = $2",
        user_id,
        team_id,
    )
    return None if row is None else Membership(*row)


async def add_member(db: Any, user_id: int, team_id: int, role: str) -> None:
    """Put ``user_id`` in ``team_id`` with ``role`` (an existing membership is kept)."""
    await db.execute(
        "INSERT INTO memberships (user_id, team_id, role) VALUES ($1, $2, $3) "
        "ON CONFLICT (user_id, team_id) DO NOTHING",
        user_id,
        team_id,
        role,
    )


class MembershipError(ValueError):
    """A membership change that cannot be made; the message says why."""


async def remove_member(pool: asyncpg.Pool, team_id: int, user_id: int) -> None:
    """Take ``user_id`` out of ``team_id``; never the team's last owner.

    The team's owners are locked first, so two owners removing each other at once cannot
    leave the team with none."""
    async with pool.acquire() as conn, conn.transaction():
        owners = await conn.fetch(
            "SELECT user_id FROM memberships WHERE team_id = $1 AND role = 'owner' FOR UPDATE",
            team_id,
        )
        if [r["user_id"] for r in owners] == [user_id]:
            raise MembershipError("The team's last owner cannot leave it.")
        removed = await conn.execute(
            "DELETE FROM memberships WHERE team_id = $1 AND user_id = $2", team_id, user_id
        )
        if removed == "DELETE 0":
            raise MembershipError("That person is not in this team.")


async def members(db: Any, team_id: int) -> list[Member]:
    """Everyone in ``team_id``, owners first."""
    rows = await db.fetch(
        "SELECT u.id, u.email, m.role, m.created_at FROM memberships m "
        "JOIN users u ON u.id = m.user_id WHERE m.team_id = $1 "
        "ORDER BY m.role = 'owner' DESC, m.created_at",
        team_id,
    )
    return [Member(*r) for r in rows]
