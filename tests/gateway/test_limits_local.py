"""Admission while Postgres is down: this replica's own GCRA rates, concurrency cap and
free share, the same shape as the limits Postgres enforces."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.admission import CONCURRENT, DEGRADED, FREE_POOL, PER_MINUTE, TOKENS_PER_MINUTE
from gateway.limits import Limiter
from gateway.limits_local import LEASE_PREFIX, LocalLimits
from tests.support.gateway import plan_with, principal


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refuse_with_the_wait_and_recover_after_it() -> None:
    clock = Clock()
    local = LocalLimits(lease_s=600, clock=clock)
    who = principal(plan_with(requests_per_min=3))
    decisions = [local.admit(who, 1, 0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.req_remaining for d in decisions[:3]] == [2, 1, 0]
    assert all(d.reason == DEGRADED for d in decisions[:3])
    refused = decisions[3]
    assert refused.reason == PER_MINUTE and refused.lease is None
    assert refused.retry_after_ms == 20_000  # one emission interval of 60 s / 3
    clock.now += 19.9
    assert not local.admit(who, 1, 0).allowed
    clock.now += 0.2
    assert local.admit(who, 1, 0).allowed


def test_tokens_per_minute_count_the_reservation() -> None:
    local = LocalLimits(lease_s=600, clock=Clock())
    who = principal(plan_with(tokens_per_min=1000))
    assert local.admit(who, 600, 0).allowed
    second = local.admit(who, 600, 0)
    assert not second.allowed and second.reason == TOKENS_PER_MINUTE
    assert second.tok_remaining == 400
    assert local.admit(who, 400, 0).allowed


def test_concurrency_frees_on_release_and_a_forgotten_lease_lapses() -> None:
    clock = Clock()
    local = LocalLimits(lease_s=30, clock=clock)
    who = principal(plan_with(max_concurrent=2))
    first, second, third = (local.admit(who, 1, 0) for _ in range(3))
    assert first.allowed and second.allowed
    assert not third.allowed and third.reason == CONCURRENT
    assert first.lease is not None and first.lease.startswith(LEASE_PREFIX)
    local.release(first.lease)
    local.release(first.lease)  # twice: still one slot, not two
    assert local.admit(who, 1, 0).allowed
    assert not local.admit(who, 1, 0).allowed
    clock.now += 30  # nobody released the other two: their leases lapse
    assert local.admit(who, 1, 0).allowed
    assert local.in_flight() == 1


def test_the_free_share_holds_across_anonymous_subjects_only() -> None:
    local = LocalLimits(lease_s=600, clock=Clock())
    plan = plan_with()
    a, b = principal(plan, anonymous=True), principal(plan, anonymous=True)
    assert local.admit(a, 1, 1).allowed
    refused = local.admit(b, 1, 1)
    assert not refused.allowed and refused.reason == FREE_POOL
    assert local.admit(principal(plan), 1, 1).allowed  # a team is not in the free pool


async def _closed_pool(dsn: str) -> asyncpg.Pool:
    """A pool as the gateway sees Postgres during an outage: every call fails."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    await pool.close()
    return pool


async def test_a_limiter_without_postgres_decides_locally_with_the_same_shape(
    pg_pool: asyncpg.Pool, pg_dsn: str
) -> None:
    plan = plan_with(requests_per_min=5)
    with_pg = Limiter(pg_pool, lease_s=60)
    who_up = principal(plan)
    up = [await with_pg.admit(who_up, 1, 0) for _ in range(7)]
    without = Limiter(await _closed_pool(pg_dsn), lease_s=60)
    who_down = principal(plan)
    down = [await without.admit(who_down, 1, 0) for _ in range(7)]
    assert [(d.allowed, d.req_remaining) for d in down] == [
        (d.allowed, d.req_remaining) for d in up
    ]
    assert [d.reason for d in up] == [None] * 5 + [PER_MINUTE] * 2
    assert [d.reason for d in down] == [DEGRADED] * 5 + [PER_MINUTE] * 2
    # Only Postgres added the reservations to the daily counter that usage settles against.
    assert [d.reserved_daily for d in up] == [True] * 5 + [False] * 2
    assert not any(d.reserved_daily for d in down)


async def test_local_leases_are_released_here_not_queued_for_postgres(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = Limiter(await _closed_pool(pg_dsn), lease_s=60)
    who = principal(plan_with(max_concurrent=2))
    first, second, third = [await limiter.admit(who, 1, 0) for _ in range(3)]
    assert first.allowed and second.allowed and third.reason == CONCURRENT
    limiter.release(first.lease)
    assert (await limiter.admit(who, 1, 0)).allowed
    limiter.release(second.lease)
    await limiter.flush_releases()  # nothing was queued for the (closed) pool
    assert "leases not released" not in caplog.text
