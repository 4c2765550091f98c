"""The worker registry in Postgres: workers announce themselves, the gateway reads the list.

A worker agent calls :func:`register` once, :func:`heartbeat` every second or so with its
current load, and :func:`deregister` on a clean exit. Gateways call :func:`list_healthy`,
which leaves out workers whose last heartbeat is older than ``max_age_s`` (a crashed worker
drops out on its own). The table is created by ``migrations/0001_accounts.sql``. Every
function takes an asyncpg connection or pool, so both sides choose their own pooling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerInfo:
    """One registered worker: where to reach it, what it serves, how busy it says it is."""

    worker_id: str
    url: str
    model: str
    capacity: int
    load: int


async def register(db: Any, worker_id: str, url: str, model: str, capacity: int) -> None:
    """Add or replace ``worker_id`` (a restarted worker re-registers under the same id)."""
    await db.execute(
        """
        INSERT INTO workers (worker_id, url, model, capacity, load, started_at, heartbeat_at)
        VALUES ($1, $2, $3, $4, 0, now(), now())
        ON CONFLICT (worker_id) DO UPDATE SET url = excluded.url, model = excluded.model,
            capacity = excluded.capacity, load = 0, started_at = now(), heartbeat_at = now()
        """,
        worker_id,
        url.rstrip("/"),
        model,
        capacity,
    )


async def heartbeat(db: Any, worker_id: str, load: int) -> bool:
    """Record that ``worker_id`` is alive with ``load`` requests in flight.

    Returns False when the worker is not registered (it should call :func:`register`).
    """
    status = await db.execute(
        "UPDATE workers SET load = $2, heartbeat_at = now() WHERE worker_id = $1",
        worker_id,
        load,
    )
    return status != "UPDATE 0"


async def deregister(db: Any, worker_id: str) -> None:
    """Remove ``worker_id`` so that gateways stop routing to it at their next refresh."""
    await db.execute("DELETE FROM workers WHERE worker_id = $1", worker_id)


async def list_healthy(db: Any, max_age_s: float) -> list[WorkerInfo]:
    """Workers that heartbeated within the last ``max_age_s`` seconds, ordered by id."""
    rows = await db.fetch(
        """
        SELECT worker_id, url, model, capacity, load FROM workers
        WHERE heartbeat_at > now() - make_interval(secs => $1)
        ORDER BY worker_id
        """,
        float(max_age_s),
    )
    return [WorkerInfo(**dict(r)) for r in rows]
