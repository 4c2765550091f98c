"""A team's usage as the console shows it: per day (from the roll-up), per key, recent.

Input tokens are split into cached and uncached because they are priced differently:
``prompt_tokens`` counts every input token, ``cached_tokens`` the part served from cache,
and the ``cached_<tier>_tokens`` columns (migrations/0011_usage_tiers.sql) which tier that
part came back from. Days before those columns existed have cached tokens whose tier was not
recorded: :attr:`Day.tier_unrecorded`.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gateway.usage import TIER_COLUMNS

_TIER_SUMS = ", ".join(f"sum({column})::bigint" for column in TIER_COLUMNS.values())


@dataclass(frozen=True)
class Day:
    """One UTC day of a team's usage, all models together."""

    day: date
    requests: int
    uncached_input: int
    cached_input: int
    output: int
    #: tier -> cached input tokens that came back from it (every tier, in ladder order)
    cached_by_tier: dict[str, int] = field(default_factory=dict)

    @property
    def tier_unrecorded(self) -> int:
        """Cached input tokens whose tier was not recorded (usage before 0011)."""
        return self.cached_input - sum(self.cached_by_tier.values())


@dataclass(frozen=True)
class KeyTotal:
    """One key's share of the period."""

    prefix: str
    name: str
    requests: int
    uncached_input: int
    cached_input: int
    output: int


@dataclass(frozen=True)
class Recent:
    """One of the latest requests."""

    ts: datetime
    prefix: str
    model: str
    status: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def period(days: int, today: date | None = None) -> list[date]:
    """The last ``days`` UTC days, oldest first, ending today."""
    end = today or datetime.now(UTC).date()
    return [end - timedelta(days=n) for n in range(days - 1, -1, -1)]


async def daily(db: Any, team_id: int, days: list[date]) -> list[Day]:
    """One :class:`Day` per day in ``days`` (zeros where nothing happened)."""
    rows = await db.fetch(
        f"""
        SELECT day, sum(requests)::bigint, sum(prompt_tokens - cached_tokens)::bigint,
               sum(cached_tokens)::bigint, sum(completion_tokens)::bigint, {_TIER_SUMS}
        FROM usage_daily WHERE team_id = $1 AND day BETWEEN $2 AND $3 GROUP BY day
        """,
        team_id,
        days[0],
        days[-1],
    )
    found = {r[0]: Day(*r[:5], dict(zip(TIER_COLUMNS, r[5:], strict=True))) for r in rows}
    empty = dict.fromkeys(TIER_COLUMNS, 0)
    return [found.get(d, Day(d, 0, 0, 0, 0, empty)) for d in days]


async def by_key(db: Any, team_id: int, since: date) -> list[KeyTotal]:
    """Totals per key since ``since`` (00:00 UTC), busiest first."""
    rows = await db.fetch(
        """
        SELECT k.prefix, k.name, count(*), sum(u.prompt_tokens - u.cached_tokens),
               sum(u.cached_tokens), sum(u.completion_tokens)
        FROM usage u JOIN api_keys k ON k.id = u.key_id
        WHERE u.team_id = $1 AND u.ts >= $2::date::timestamp AT TIME ZONE 'UTC'
        GROUP BY k.id ORDER BY count(*) DESC
        """,
        team_id,
        since,
    )
    return [KeyTotal(*r) for r in rows]


async def recent(db: Any, team_id: int, limit: int = 20) -> list[Recent]:
    """The team's latest requests, newest first."""
    rows = await db.fetch(
        """
        SELECT u.ts, coalesce(k.prefix, ''), u.model, u.status, u.prompt_tokens,
               u.cached_tokens, u.completion_tokens
        FROM usage u LEFT JOIN api_keys k ON k.id = u.key_id
        WHERE u.team_id = $1 ORDER BY u.ts DESC LIMIT $2
        """,
        team_id,
        limit,
    )
    return [Recent(*r) for r in rows]


_CSV_HEADER = [
    "day",
    "model",
    "requests",
    "uncached_input_tokens",
    "cached_input_tokens",
    "output_tokens",
    *TIER_COLUMNS.values(),
]


async def csv_rows(db: Any, team_id: int, since: date) -> str:
    """Daily usage per model since ``since`` as CSV text (header first)."""
    rows = await db.fetch(
        f"""
        SELECT day, model, requests, prompt_tokens - cached_tokens, cached_tokens,
               completion_tokens, {", ".join(TIER_COLUMNS.values())}
        FROM usage_daily WHERE team_id = $1 AND day >= $2 ORDER BY day, model
        """,
        team_id,
        since,
    )
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(_CSV_HEADER)
    writer.writerows([r[0].isoformat(), *r[1:]] for r in rows)
    return out.getvalue()
