"""An admission decision, and how it is reported to the client.

:mod:`gateway.limits` decides in Postgres; :mod:`gateway.limits_local` decides on this
replica alone while Postgres is unavailable. Both answer with a :class:`Decision`, which
becomes OpenAI's ``x-ratelimit-*`` headers and, on a refusal, ``retry-after`` and a message
that names the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.accounts import Plan

#: Reasons a request is refused (``Decision.reason``), as ``gateway_admit`` names them.
PER_MINUTE = "requests_per_min"
TOKENS_PER_MINUTE = "tokens_per_min"
DAILY = "tokens_per_day"
CONCURRENT = "max_concurrent"
FREE_POOL = "pool_capacity"
#: Reason on an admission made without Postgres (by this replica alone, see
#: :mod:`gateway.limits_local`).
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

    @property
    def reserved_daily(self) -> bool:
        """Whether admission added the reservation to the shared daily quota counter: a
        lease decided in Postgres did, one decided locally while it was down did not."""
        return self.lease is not None and self.reason != DEGRADED


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


def refusal_message(decision: Decision, plan: Plan, *, anonymous: bool) -> str:
    """The error message of a refused request: which limit of which plan, and what to do."""
    what = {
        PER_MINUTE: f"{plan.requests_per_min} requests per minute",
        TOKENS_PER_MINUTE: f"{plan.tokens_per_min} tokens per minute",
        DAILY: f"{plan.tokens_per_day} tokens per day (resets at 00:00 UTC)",
        CONCURRENT: f"{plan.max_concurrent} concurrent requests",
        FREE_POOL: "the free tier's share of capacity, which is in use",
    }.get(decision.reason or "", decision.reason or "a limit")
    hint = " Use an API key for higher limits." if anonymous else ""
    return f"Rate limit reached: {what} on plan {plan.name!r}.{hint}"
