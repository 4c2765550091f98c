"""Teams, plans and API keys in Postgres: the admin operations and the key lookup.

Used by ``kvgate admin`` (create/list/revoke), the console's key pages and the gateway's
authenticator (:func:`lookup_key`). Every function takes an asyncpg connection or pool.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway import keys


class AccountError(ValueError):
    """An admin operation cannot be done; the message says what to change."""


@dataclass(frozen=True)
class Plan:
    """What a tier may do (see ``migrations/0001_accounts.sql``)."""

    name: str
    requests_per_min: int
    tokens_per_min: int
    tokens_per_day: int
    max_concurrent: int
    max_max_tokens: int
    max_context: int


@dataclass(frozen=True)
class Team:
    """A customer account."""

    id: int
    name: str
    plan: str
    cache_salt: str
    created_at: datetime


@dataclass(frozen=True)
class KeyRow:
    """A key of one team as its pages list it (never the secret)."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used: datetime | None


@dataclass(frozen=True)
class KeyInfo:
    """An API key as listed (never the secret)."""

    id: int
    team: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class KeyOwner:
    """What a valid key resolves to: the key, its team and the team's plan."""

    key_id: int
    team_id: int
    team: str
    cache_salt: str
    plan: Plan


_PLAN_COLUMNS = (
    "p.name, p.requests_per_min, p.tokens_per_min, p.tokens_per_day, "
    "p.max_concurrent, p.max_max_tokens, p.max_context"
)


async def get_plan(db: Any, name: str, *, timeout: float | None = None) -> Plan:
    """The plan called ``name``."""
    row = await db.fetchrow(
        f"SELECT {_PLAN_COLUMNS} FROM plans p WHERE p.name = $1", name, timeout=timeout
    )
    if row is None:
        raise AccountError(f"no plan named {name!r}; see the plans table for the names")
    return Plan(*row)


async def create_team(db: Any, name: str, plan: str = "team") -> Team:
    """A new team on ``plan`` with a fresh random cache salt."""
    await get_plan(db, plan)
    row = await db.fetchrow(
        """
        INSERT INTO teams (name, plan, cache_salt) VALUES ($1, $2, $3)
        ON CONFLICT (name) DO NOTHING
        RETURNING id, name, plan, cache_salt, created_at
        """,
        name,
        plan,
        secrets.token_hex(16),
    )
    if row is None:
        raise AccountError(f"a team named {name!r} already exists; pick another name")
    return Team(*row)


async def team_keys(db: Any, team_id: int) -> list[KeyRow]:
    """The team's keys as the console and staff list them: active first, newest first."""
    rows = await db.fetch(
        """
        SELECT k.id, k.name, k.prefix, k.created_at, k.revoked_at,
               (SELECT max(u.ts) FROM usage u WHERE u.key_id = k.id)
        FROM api_keys k WHERE k.team_id = $1 ORDER BY k.revoked_at IS NOT NULL, k.id DESC
        """,
        team_id,
    )
    return [KeyRow(*r) for r in rows]


async def list_teams(db: Any) -> list[Team]:
    """Every team, oldest first."""
    rows = await db.fetch("SELECT id, name, plan, cache_salt, created_at FROM teams ORDER BY id")
    return [Team(*r) for r in rows]


async def create_key(db: Any, team: str, name: str = "") -> tuple[KeyInfo, str]:
    """A new key for ``team``; returns its listing and the secret (which is not stored).

    It shares the team's row lock, so it waits for a suspension being committed and is
    then born revoked like the team's other keys (``gateway.admin.teams.suspend``).
    """
    new = keys.mint()
    row = await db.fetchrow(
        """
        INSERT INTO api_keys (team_id, name, prefix, key_hash)
        SELECT id, $2, $3, $4 FROM teams WHERE name = $1 FOR SHARE
        RETURNING id, $1::text, name, prefix, created_at, revoked_at
        """,
        team,
        name,
        new.prefix,
        new.key_hash,
    )
    if row is None:
        raise AccountError(f"no team named {team!r}; create it with `kvgate admin teams create`")
    return KeyInfo(*row), new.secret


async def list_keys(db: Any, team: str | None = None) -> list[KeyInfo]:
    """Keys of ``team`` (every team when None), oldest first."""
    rows = await db.fetch(
        """
        SELECT k.id, t.name, k.name, k.prefix, k.created_at, k.revoked_at
        FROM api_keys k JOIN teams t ON t.id = k.team_id
        WHERE $1::text IS NULL OR t.name = $1
        ORDER BY k.id
        """,
        team,
    )
    return [KeyInfo(*r) for r in rows]


async def revoke_key(db: Any, key_id: int) -> KeyInfo:
    """Revoke key ``key_id`` (idempotent); gateways stop accepting it within their cache TTL.

    A suspended team's keys are already revoked, and unsuspending restores the ones the
    suspension keeps (``gateway.admin.teams``); revoking one of them takes it off that
    list in the same statement, so the owner's revocation outlasts the suspension.
    """
    row = await db.fetchrow(
        """
        WITH revoked AS (
            UPDATE api_keys k SET revoked_at = coalesce(k.revoked_at, now())
            FROM teams t WHERE k.id = $1 AND t.id = k.team_id
            RETURNING k.id, t.id AS team_id, t.name AS team, k.name, k.prefix, k.created_at,
                      k.revoked_at
        ), kept AS (
            UPDATE team_suspensions s SET key_ids = array_remove(s.key_ids, $1)
            FROM revoked r WHERE s.team_id = r.team_id
        )
        SELECT id, team, name, prefix, created_at, revoked_at FROM revoked
        """,
        key_id,
    )
    if row is None:
        raise AccountError(f"no key with id {key_id}; `kvgate admin keys list` shows the ids")
    return KeyInfo(*row)


async def lookup_key(db: Any, secret: str, *, timeout: float | None = None) -> KeyOwner | None:
    """The owner of an active key ``secret``; None when unknown or revoked."""
    row = await db.fetchrow(
        f"""
        SELECT k.id, t.id, t.name, t.cache_salt, {_PLAN_COLUMNS}
        FROM api_keys k JOIN teams t ON t.id = k.team_id JOIN plans p ON p.name = t.plan
        WHERE k.key_hash = $1 AND k.revoked_at IS NULL
        """,
        keys.hash_key(secret),
        timeout=timeout,
    )
    if row is None:
        return None
    return KeyOwner(row[0], row[1], row[2], row[3], Plan(*row[4:]))
