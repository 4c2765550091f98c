"""Usage settlement: the daily quota ends at the tokens actually used, on the right day."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import asyncpg

from gateway.usage import UsageRecorder, UsageRow


def _row(subject: str, ts: datetime, tokens: int, reserved: int, latency_ms: float) -> UsageRow:
    return UsageRow(
        request_id=uuid.uuid4().hex,
        ts=ts,
        team_id=None,
        key_id=None,
        client_ip="203.0.113.9",
        subject=subject,
        model="m-usage",
        worker="w",
        prompt_tokens=tokens // 2,
        cached_tokens=0,
        completion_tokens=tokens - tokens // 2,
        reserved_tokens=reserved,
        ttft_ms=None,
        latency_ms=latency_ms,
        status=200,
    )


async def _used(pool: asyncpg.Pool, subject: str) -> dict[date, int]:
    rows = await pool.fetch("SELECT day, used FROM rate_daily WHERE subject = $1", subject)
    return {r["day"]: r["used"] for r in rows}


async def test_a_request_across_midnight_settles_on_its_admission_day(
    pg_pool: asyncpg.Pool,
) -> None:
    """Admitted at 23:59:58 (reserving 500 on that day), finished at 00:00:02 having used
    120: the day it reserved on ends at 120, and the new day is not touched."""
    subject = f"ip:{uuid.uuid4().hex}"
    midnight = datetime(2026, 3, 2, tzinfo=UTC)
    before = midnight.date() - timedelta(days=1)
    await pg_pool.execute(
        "INSERT INTO rate_daily (subject, day, used) VALUES ($1, $2, 500)", subject, before
    )
    recorder = UsageRecorder(pg_pool, flush_s=60, buffer_max=100)
    recorder.record(_row(subject, midnight + timedelta(seconds=2), 120, 500, latency_ms=4000))
    await recorder.flush()
    assert await _used(pg_pool, subject) == {before: 120}


async def test_requests_admitted_without_postgres_count_all_their_tokens(
    pg_pool: asyncpg.Pool,
) -> None:
    """A request admitted locally during an outage reserved nothing in Postgres: its
    whole use is added when its row lands, next to a settled request of the same day."""
    subject = f"ip:{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    day = (now - timedelta(milliseconds=10)).date()
    await pg_pool.execute(
        "INSERT INTO rate_daily (subject, day, used) VALUES ($1, $2, 300)", subject, day
    )
    recorder = UsageRecorder(pg_pool, flush_s=60, buffer_max=100)
    recorder.record(_row(subject, now, 100, 300, latency_ms=10))  # admitted in Postgres
    recorder.record(_row(subject, now, 70, 0, latency_ms=10))  # admitted locally
    await recorder.flush()
    assert await _used(pg_pool, subject) == {day: 170}
    # A second subject seen only during the outage gets its day's row from the settlement.
    fresh = f"ip:{uuid.uuid4().hex}"
    recorder.record(_row(fresh, now, 40, 0, latency_ms=10))
    await recorder.flush()
    assert await _used(pg_pool, fresh) == {day: 40}
