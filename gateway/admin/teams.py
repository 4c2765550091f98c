"""Teams as staff see them (plan, usage, keys), and suspension.

Suspending a team revokes its active keys — the one thing every gateway replica checks
on each key lookup, so the keys stop working within the gateways' key-cache TTL — and
keeps their ids; unsuspending restores exactly those keys. A key created during the
suspension is born revoked (a trigger, see ``migrations/0005_leads_admin.sql``), and a key
revoked during it (``gateway.accounts.revoke_key``) leaves the list and stays revoked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


class TeamError(ValueError):
    """A team action cannot be applied; the message says why."""


@dataclass(frozen=True)
class TeamRow:
    """A team with its plan, keys and last 30 days of tokens."""

    id: int
    name: str
    plan: str
    created_at: datetime
    members: int
    active_keys: int
    tokens_30d: int
    requests_30d: int
    suspended_at: datetime | None


_TEAMS = """
    SELECT t.id, t.name, t.plan, t.created_at,
           (SELECT count(*) FROM memberships m WHERE m.team_id = t.id),
           (SELECT count(*) FROM api_keys k WHERE k.team_id = t.id AND k.revoked_at IS NULL),
           coalesce(u.tokens, 0), coalesce(u.requests, 0), s.suspended_at
    FROM teams t
    LEFT JOIN team_suspensions s ON s.team_id = t.id
    LEFT JOIN (
        SELECT team_id, sum(prompt_tokens + completion_tokens) AS tokens, sum(requests) AS requests
        FROM usage_daily WHERE day > (now() AT TIME ZONE 'UTC')::date - 30 GROUP BY team_id
    ) u ON u.team_id = t.id
"""


async def search_teams(db: Any, q: str = "") -> list[TeamRow]:
    """Teams whose name contains ``q``, biggest users first (at most 500)."""
    rows = await db.fetch(
        _TEAMS + " WHERE $1 = '' OR t.name ILIKE '%' || $1 || '%' "
        "ORDER BY coalesce(u.tokens, 0) DESC, t.id LIMIT 500",
        q,
    )
    return [TeamRow(*r) for r in rows]


async def get_team(db: Any, team_id: int) -> TeamRow | None:
    """Team ``team_id``, or None."""
    row = await db.fetchrow(_TEAMS + " WHERE t.id = $1", team_id)
    return None if row is None else TeamRow(*row)


async def suspend(conn: Any, team_id: int, by: int | None, reason: str) -> list[int]:
    """Suspend ``team_id``: revoke its active keys; returns their ids. Run in a transaction.

    The team's row is locked first, as :func:`gateway.accounts.create_key` shares it: a key
    made while this runs waits for the commit and is then born revoked (by the trigger on
    ``api_keys``), instead of slipping between the revocation and the commit, active.
    """
    await conn.execute("SELECT 1 FROM teams WHERE id = $1 FOR UPDATE", team_id)
    inserted = await conn.fetchval(
        "INSERT INTO team_suspensions (team_id, suspended_by, reason) VALUES ($1, $2, $3) "
        "ON CONFLICT (team_id) DO NOTHING RETURNING team_id",
        team_id,
        by,
        reason,
    )
    if inserted is None:
        raise TeamError("The team is already suspended.")
    revoked = await conn.fetch(
        "UPDATE api_keys SET revoked_at = now() WHERE team_id = $1 AND revoked_at IS NULL "
        "RETURNING id",
        team_id,
    )
    ids = sorted(r[0] for r in revoked)
    await conn.execute(
        "UPDATE team_suspensions SET key_ids = key_ids || $2::bigint[] WHERE team_id = $1",
        team_id,
        ids,
    )
    return ids


async def unsuspend(conn: Any, team_id: int) -> list[int]:
    """Lift the suspension: restore the keys it revoked; returns their ids."""
    key_ids = await conn.fetchval(
        "DELETE FROM team_suspensions WHERE team_id = $1 RETURNING key_ids", team_id
    )
    if key_ids is None:
        raise TeamError("The team is not suspended.")
    restored = await conn.fetch(
        "UPDATE api_keys SET revoked_at = NULL WHERE id = ANY($1::bigint[]) RETURNING id",
        key_ids,
    )
    return sorted(r[0] for r in restored)
