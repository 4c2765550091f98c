"""Admission while Postgres is unavailable: this replica's own count of every limit it can.

Normally every admission is decided in Postgres (:mod:`gateway.limits`), exactly across
replicas. When Postgres cannot answer, refusing everyone would turn a database blip into
an outage, and admitting everyone would open the free endpoint to anyone during it. So
each replica keeps, in memory, the same limits that need no history: requests and tokens
per minute by GCRA (the algorithm of ``gateway_admit``, so limits keep their shape), the
per-subject cap on concurrent requests and the free tier's in-flight share. They hold per
replica, so with N replicas a subject may get up to N times its rate while the outage lasts;
the daily quota is not enforced, since its count lives in Postgres.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gateway.admission import (
    CONCURRENT,
    DEGRADED,
    FREE_POOL,
    PER_MINUTE,
    TOKENS_PER_MINUTE,
    Decision,
)
from gateway.auth import Principal

#: the GCRA window, as in ``gateway_admit``: a subject may burst a whole minute's quota
WINDOW_MS = 60_000.0
#: lease ids handed out here start with this (Postgres never sees them)
LEASE_PREFIX = "local:"
#: past this many subjects, those whose state has decayed to nothing are forgotten
PRUNE_AT = 10_000


@dataclass
class _Rates:
    """A subject's theoretical arrival times (ms on the local clock) for requests, tokens."""

    req_tat: float
    tok_tat: float


class LocalLimits:
    """Per-replica GCRA rates, concurrency caps and free-tier share (see the module doc)."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """A lease not released within ``lease_s`` lapses, as leases in Postgres do;
        ``clock`` returns seconds (monotonic), tests pass their own."""
        self._lease_ms = lease_s * 1000
        self._clock = clock
        self._rates: dict[str, _Rates] = {}
        self._busy: Counter[str] = Counter()
        self._free_busy = 0
        #: lease -> (subject, anonymous, when it lapses)
        self._leases: dict[str, tuple[str, bool, float]] = {}

    def admit(self, who: Principal, cost: int, free_slots: int) -> Decision:
        """Admit ``who`` reserving ``cost`` tokens (reason ``degraded``), or say which limit
        refuses it and when to retry; an admitted request holds a lease until
        :meth:`release`. The daily quota's remainder is unknown here: the whole is reported."""
        now = self._clock() * 1000
        self._lapse(now)
        plan, subject = who.plan, who.subject
        req_t = WINDOW_MS / plan.requests_per_min
        tok_t = WINDOW_MS / plan.tokens_per_min
        rates = self._rates.get(subject) or _Rates(now, now)
        req_new = max(rates.req_tat, now) + req_t
        tok_new = max(rates.tok_tat, now) + cost * tok_t
        reason: str | None = None
        retry = 0.0
        if req_new - now > WINDOW_MS + 1:
            reason, retry = PER_MINUTE, req_new - now - WINDOW_MS
        elif tok_new - now > WINDOW_MS + 1:
            reason, retry = TOKENS_PER_MINUTE, tok_new - now - WINDOW_MS
        elif self._busy[subject] >= plan.max_concurrent:
            reason, retry = CONCURRENT, 1000.0
        elif who.anonymous and self._free_busy >= free_slots:
            reason, retry = FREE_POOL, 1000.0
        lease = None
        if reason is None:
            rates.req_tat, rates.tok_tat = req_new, tok_new
            self._remember(subject, rates, now)
            lease = f"{LEASE_PREFIX}{uuid.uuid4().hex}"
            self._leases[lease] = (subject, who.anonymous, now + self._lease_ms)
            self._busy[subject] += 1
            self._free_busy += who.anonymous
        req_ahead = max(rates.req_tat, now) - now
        tok_ahead = max(rates.tok_tat, now) - now
        return Decision(
            allowed=reason is None,
            reason=reason or DEGRADED,
            retry_after_ms=math.ceil(retry),
            req_remaining=max(0, math.floor((WINDOW_MS - req_ahead) / req_t + 0.001)),
            req_reset_ms=math.ceil(req_ahead),
            tok_remaining=max(0, math.floor((WINDOW_MS - tok_ahead) / tok_t + 0.001)),
            tok_reset_ms=math.ceil(tok_ahead),
            day_remaining=plan.tokens_per_day,
            lease=lease,
        )

    def release(self, lease: str) -> None:
        """End a lease handed out by :meth:`admit` (unknown ones are ignored)."""
        held = self._leases.pop(lease, None)
        if held is None:
            return
        subject, anonymous, _ = held
        self._busy[subject] -= 1
        if not self._busy[subject]:
            del self._busy[subject]
        self._free_busy -= anonymous

    def in_flight(self) -> int:
        """Requests admitted here and not released yet."""
        return len(self._leases)

    def _lapse(self, now: float) -> None:
        # leases are kept in the order they were given, which is the order they lapse in
        # (one lease time, a monotonic clock): only the oldest few are ever looked at
        while self._leases:
            lease, (_, _, until) = next(iter(self._leases.items()))
            if until > now:
                return
            self.release(lease)

    def _remember(self, subject: str, rates: _Rates, now: float) -> None:
        self._rates[subject] = rates
        if len(self._rates) > PRUNE_AT:  # forget subjects whose minute has passed
            self._rates = {s: r for s, r in self._rates.items() if max(r.req_tat, r.tok_tat) > now}
