"""Admission in Postgres: GCRA request and token limits, daily quota, concurrency, free pool."""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.admission import DAILY, FREE_POOL, duration, rate_headers
from gateway.limits import Limiter
from tests.support.gateway import apoll, plan_with, principal


async def test_requests_per_minute_is_exact_under_concurrency(pg_pool: asyncpg.Pool) -> None:
    limiter = Limiter(pg_pool, lease_s=60)
    who = principal(plan_with(requests_per_min=7))
    decisions = await asyncio.gather(*(limiter.admit(who, 1, 0) for _ in range(12)))
    allowed = [d for d in decisions if d.allowed]
    refused = [d for d in decisions if not d.allowed]
    assert len(allowed) == 7
    assert sorted(d.req_remaining for d in allowed) == list(range(7))
    assert all(d.reason == "requests_per_min" and d.retry_after_ms > 0 for d in refused)
    headers = rate_headers(who.plan, refused[0])
    assert headers["x-ratelimit-limit-requests"] == "7"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert int(headers["retry-after"]) >= 1 and "x-should-retry" not in headers


async def test_concurrency_cap_frees_on_release(pg_pool: asyncpg.Pool) -> None:
    limiter = Limiter(pg_pool, lease_s=60)
    who = principal(plan_with(max_concurrent=2))
    first, second, third = [await limiter.admit(who, 1, 0) for _ in range(3)]
    assert first.allowed and second.allowed and not third.allowed
    assert third.reason == "max_concurrent"
    releaser = asyncio.create_task(limiter.run())
    try:
        limiter.release(first.lease)
        # The release is written in the background, moments later.
        await apoll(lambda: limiter.admit(who, 1, 0), lambda d: d.allowed, what="slot freed")
    finally:
        releaser.cancel()


async def test_expired_leases_do_not_count(pg_pool: asyncpg.Pool) -> None:
    limiter = Limiter(pg_pool, lease_s=0)  # every lease is already expired
    who = principal(plan_with(max_concurrent=1))
    assert (await limiter.admit(who, 1, 0)).allowed
    assert (await limiter.admit(who, 1, 0)).allowed


async def test_daily_quota_says_do_not_retry(pg_pool: asyncpg.Pool) -> None:
    limiter = Limiter(pg_pool, lease_s=60)
    who = principal(plan_with(tokens_per_day=100))
    ok = await limiter.admit(who, 60, 0)
    assert ok.allowed and ok.day_remaining == 40
    spent = await limiter.admit(who, 60, 0)
    assert not spent.allowed and spent.reason == DAILY
    headers = rate_headers(who.plan, spent)
    assert headers["x-should-retry"] == "false"
    assert 0 < spent.retry_after_ms <= 86_400_000


async def test_tokens_per_minute_counts_the_reservation(pg_pool: asyncpg.Pool) -> None:
    limiter = Limiter(pg_pool, lease_s=60)
    who = principal(plan_with(tokens_per_min=1000))
    first = await limiter.admit(who, 600, 0)
    assert first.allowed and first.tok_remaining == 400
    second = await limiter.admit(who, 600, 0)
    assert not second.allowed and second.reason == "tokens_per_min"


async def test_free_pool_caps_all_anonymous_clients_together(pg_pool: asyncpg.Pool) -> None:
    await pg_pool.execute("DELETE FROM inflight WHERE pool = 'free'")
    limiter = Limiter(pg_pool, lease_s=60)
    plan = plan_with()
    a, b, c = (principal(plan, anonymous=True) for _ in range(3))
    d1, d2, d3 = [await limiter.admit(w, 1, 2) for w in (a, b, c)]
    assert d1.allowed and d2.allowed and not d3.allowed and d3.reason == FREE_POOL
    limiter.release(d1.lease)
    await limiter.flush_releases()
    assert (await limiter.admit(c, 1, 2)).allowed
    await pg_pool.execute("DELETE FROM inflight WHERE pool = 'free'")


def test_durations_read_like_openai_headers() -> None:
    assert [duration(x) for x in (20, 1500, 360_000)] == ["20ms", "1.5s", "6m0s"]
