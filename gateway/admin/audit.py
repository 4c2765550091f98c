"""The audit log: every admin action with who, what, when, and the state before and after.

Writers call :func:`record` on the connection of the transaction that makes the change,
so an action and its audit row are committed together or not at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from gateway.pages.sessions import SessionUser


@dataclass(frozen=True)
class Entry:
    """One audit row as listed."""

    at: datetime
    actor: str
    action: str
    target: str
    before: str
    after: str


def _json(value: dict[str, Any] | None) -> str | None:
    if value is None:
        return None

    def plain(v: Any) -> Any:
        return v.isoformat() if isinstance(v, date | datetime) else v

    return json.dumps({k: plain(v) for k, v in value.items()}, sort_keys=True)


async def record(
    conn: Any,
    actor: SessionUser,
    action: str,
    target: str,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Log that ``actor`` did ``action`` to ``target`` (e.g. ``lead:12``)."""
    await conn.execute(
        "INSERT INTO admin_audit (actor_id, actor_email, action, target, before, after) "
        "VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)",
        actor.id,
        actor.email,
        action,
        target,
        _json(before),
        _json(after),
    )


async def recent(db: Any, limit: int = 200, target: str = "") -> list[Entry]:
    """The newest ``limit`` entries, optionally only those about ``target``."""
    rows = await db.fetch(
        "SELECT at, actor_email, action, target, coalesce(before::text, ''), "
        "coalesce(after::text, '') FROM admin_audit WHERE $2 = '' OR target = $2 "
        "ORDER BY at DESC, id DESC LIMIT $1",
        limit,
        target,
    )
    return [Entry(*r) for r in rows]
