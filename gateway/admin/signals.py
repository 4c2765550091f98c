"""What the product knows about a prospect's trial use, and the lead score derived from it.

Trial use is the free tier's traffic that can be tied to a lead: anonymous requests from
the address the contact form came from, and requests of free-plan teams that have a member
with the lead's email domain (unless it is a public mail domain, where the domain says
nothing about the company).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.public.leads import MONTHLY_TOKENS, TEAM_SIZES

#: Domains shared by unrelated people: never matched to a lead's company.
PUBLIC_MAIL_DOMAINS = (
    "gmail.com",
    "googlemail.com",
    "outlook.com",
    "hotmail.com",
    "live.com",
    "yahoo.com",
    "icloud.com",
    "proton.me",
    "protonmail.com",
    "gmx.com",
    "aol.com",
)

#: A lateral subquery over ``usage`` for the lead aliased ``l``; $1 is PUBLIC_MAIL_DOMAINS.
SIGNALS_SQL = """
    SELECT count(*) AS trial_requests,
           coalesce(sum(u.prompt_tokens + u.completion_tokens), 0) AS trial_tokens,
           max(u.ts) AS last_seen,
           count(*) FILTER (WHERE u.status = 429) AS limit_hits
    FROM usage u
    WHERE (u.team_id IS NULL AND u.client_ip = l.client_ip)
       OR u.team_id IN (
            SELECT m.team_id FROM memberships m
            JOIN users mu ON mu.id = m.user_id JOIN teams t ON t.id = m.team_id
            WHERE t.plan = 'free' AND split_part(mu.email, '@', 2) = l.email_domain
              AND l.email_domain <> ALL($1::text[]))
"""

#: 0 to 20 points along the contact form's choices, smallest first.
_SIZE_POINTS = {size: 5 * i for i, size in enumerate(TEAM_SIZES)}
_VOLUME_POINTS = {volume: 5 * i for i, volume in enumerate(MONTHLY_TOKENS)}


@dataclass(frozen=True)
class TrialUse:
    """Free-tier use tied to one lead."""

    requests: int
    tokens: int
    last_seen: datetime | None
    limit_hits: int


def score(use: TrialUse, team_size: str, monthly_tokens: str, now: datetime | None = None) -> int:
    """0-100: how promising a lead looks from its trial use and what it told us.

    Up to 20 points each for using the product (requests, log scale), volume of tokens
    (log scale), having hit a free-tier limit (they need more), recent activity, and the
    stated company size plus expected volume (10 each).
    """
    now = now or datetime.now(UTC)
    points = min(20.0, 5 * math.log10(1 + use.requests))
    points += min(20.0, 3 * math.log10(1 + use.tokens))
    points += 20 if use.limit_hits else 0
    if use.last_seen is not None:
        days = (now - use.last_seen).total_seconds() / 86400
        points += 20 if days <= 7 else 10 if days <= 30 else 0
    points += _SIZE_POINTS.get(team_size, 0) / 2 + _VOLUME_POINTS.get(monthly_tokens, 0) / 2
    return min(100, round(points))
