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
import math
import uuid
from dataclasses import dataclass

import asyncpg

from gateway.accounts import Plan
from gateway.auth import Principal
from gateway.db import HOT_TIMEOUT_S, UNAVAILABLE

log = logging.getLogger(__name__)

#: Reasons a request is refused (``Decision.reason``).
DAILY = "tokens_per_day"
FREE_POOL = "pool_capacity"
#: Reason on an admission made without Postgres (fail open, see :meth:`Limiter.admit`).
DEGRADED = "degraded"


@dataclass(frozen=True)
class Decision:
    """The outcome of one admission, with what the rate-limit headers report."""

    allowed: bool
    reason: str | None
    retry_after_ms: int
    req_remaining: int
    req_reset_ms: int
    tok_remaining: int
    tok_reset_ms: int
    day_remaining: int
    lease: str | None


class Limiter:
    """Admits or refuses requests against their plan, using the shared Postgres."""

    def __init__(self, pool: asyncpg.Pool, lease_s: float) -> None:
        self._pool = pool
        self._lease_ms = int(lease_s * 1000)
        self._ended: list[str] = []
        self._wake = asyncio.Event()

    async def admit(self, who: Principal, cost: int, free_slots: int) -> Decision:
        """Decide for one request reserving ``cost`` tokens.

        ``free_slots`` caps in-flight free-tier requests across all replicas. When
        Postgres is unavailable the request is admitted without a lease (reason
        ``degraded``): refusing paying traffic during a database blip costs more than a
        few seconds of unenforced limits.
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
            return Decision(
                True,
                DEGRADED,
                0,
                plan.requests_per_min,
                0,
                plan.tokens_per_min,
                0,
                plan.tokens_per_day,
                None,
            )
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
        if lease is not None:
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


def rate_headers(plan: Plan, decision: Decision | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers (limits only when no decision was made yet)."""
    headers = {
        "x-ratelimit-limit-requests": str(plan.requests_per_min),
        "x-ratelimit-limit-tokens": str(plan.tokens_per_min),
    }
    if decision is None:
        return headers
    headers["x-ratelimit-remaining-requests"] = str(decision.req_remaining)
    headers["x-ratelimit-reset-requests"] = duration(decision.req_reset_ms)
    headers["x-ratelimit-remaining-tokens"] = str(decision.tok_remaining)
    headers["x-ratelimit-reset-tokens"] = duration(decision.tok_reset_ms)
    if not decision.allowed:
        headers["retry-after"] = str(max(1, math.ceil(decision.retry_after_ms / 1000)))
        headers["retry-after-ms"] = str(decision.retry_after_ms)
        if decision.reason == DAILY:
            headers["x-should-retry"] = "false"
    return headers


def duration(ms: int) -> str:
    """Milliseconds in OpenAI's header style: ``20ms``, ``1.5s``, ``6m0s``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s"
