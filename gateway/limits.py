"""Admission: rate limits, token quotas and concurrency caps, exact across replicas.

Every decision is one call of the ``gateway_admit`` SQL function (migration 0001), which
runs GCRA for requests and tokens, the daily token quota, the per-subject concurrency cap
and, for the free tier, the global free-tier share of worker capacity, under a row lock on
the subject. Any number of replicas therefore agree exactly, with Postgres as the only
shared state. An admitted request holds a lease (one row) until :meth:`Limiter.release`;
leases expire on their own so a crashed replica cannot pin a team's slots forever.

Tokens per minute count the reservation (estimated prompt + ``max_tokens``), as OpenAI
does; the daily quota is settled to the actual tokens when usage is written.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg

from gateway.admission import Decision
from gateway.auth import Principal
from gateway.db import HOT_TIMEOUT_S, UNAVAILABLE
from gateway.limits_local import LEASE_PREFIX, LocalLimits

log = logging.getLogger(__name__)


class Limiter:
    """Admits or refuses requests against their plan, using the shared Postgres (and this
    replica's own count while Postgres is unavailable)."""

    def __init__(self, pool: asyncpg.Pool, lease_s: float) -> None:
        self._pool = pool
        self._lease_ms = int(lease_s * 1000)
        self._local = LocalLimits(lease_s)
        self._ended: list[str] = []
        self._wake = asyncio.Event()

    async def admit(self, who: Principal, cost: int, free_slots: int) -> Decision:
        """Decide for one request reserving ``cost`` tokens.

        ``free_slots`` caps in-flight free-tier requests across all replicas. When
        Postgres is unavailable this replica decides alone (:mod:`gateway.limits_local`):
        per-minute rates, concurrency and the free share hold per replica, and an admission
        says ``degraded``. Refusing paying traffic during a database blip would cost more
        than a few minutes of limits that are per replica; admitting everyone would open
        the free endpoint to anyone meanwhile.
        """
        lease = uuid.uuid4().hex
        plan = who.plan
        try:
            row = await self._pool.fetchrow(
                "SELECT * FROM gateway_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                who.subject,
                plan.requests_per_min,
                plan.tokens_per_min,
                plan.tokens_per_day,
                plan.max_concurrent,
                cost,
                lease,
                self._lease_ms,
                "free" if who.anonymous else None,
                free_slots,
                timeout=HOT_TIMEOUT_S,
            )
        except UNAVAILABLE:
            return self._local.admit(who, cost, free_slots)
        assert row is not None
        return Decision(
            row["allowed"],
            row["reason"],
            int(row["retry_after_ms"]),
            row["req_remaining"],
            int(row["req_reset_ms"]),
            row["tok_remaining"],
            int(row["tok_reset_ms"]),
            int(row["day_remaining"]),
            lease if row["allowed"] else None,
        )

    def release(self, lease: str | None) -> None:
        """End a lease. Never waits: :meth:`run` deletes ended leases in batches."""
        if lease is None:
            return
        if lease.startswith(LEASE_PREFIX):
            self._local.release(lease)
            return
        self._ended.append(lease)
        self._wake.set()

    async def run(self) -> None:
        """Delete ended leases forever, one statement for all that ended meanwhile.

        A lease is deleted as soon as the previous batch is done, so under load releases
        coalesce instead of costing a round trip each, and idle they go out at once.
        """
        while True:
            await self._wake.wait()
            await self.flush_releases()

    async def flush_releases(self) -> None:
        """Delete the leases ended so far (best effort: a lease left behind expires)."""
        self._wake.clear()
        batch, self._ended = self._ended, []
        if not batch:
            return
        try:
            await self._pool.execute(
                "DELETE FROM inflight WHERE lease_id = any($1::text[])",
                batch,
                timeout=HOT_TIMEOUT_S,
            )
        except Exception as exc:  # any failure: the leases expire on their own
            log.warning("%d leases not released (they will expire): %r", len(batch), exc)
