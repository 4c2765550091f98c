"""Metered usage to Stripe Billing Meters, one event per team, meter and closed interval.

Three meters, so each can have its own price: uncached input tokens, cached input tokens
and output tokens.

Stripe bills a meter event by its timestamp, against the subscription's billing period that
holds it, and finalizes a period's invoice about an hour after the period ends (the final
invoice of a cancelled subscription is made at the cancellation, and finalized as soon). An
event stamped outside a period, or arriving after its invoice was finalized, is never
billed. So every event must be stamped inside the time it covers and be sent within minutes
of that time closing. Usage is therefore reported by *interval*: a UTC hour, cut wherever a
billing period starts or ends (a renewal, a cancellation, a start in mid-hour), so no
interval straddles two invoices. An interval is closed :data:`SETTLE` after its end and is
sent by the next report, stamped at its midpoint: usage before a renewal at 14:37 is
stamped before 14:37 and, with a report every 15 minutes, sent by 15:02, well before the
old invoice is finalized.

Each report first *plans*, under a table lock: for every team it writes one
``meter_reports`` row per meter for each closed interval with usage since the team's latest
row (so no interval is ever planned twice, even by two reporters at once). A row fixes the
event completely (identifier, customer, timestamp, value). Then it sends every row not yet
acknowledged. A retry (by stripe-python after a 5xx, by the next run after a crash, or by a
second reporter) repeats the identical request under the same identifier and idempotency
key, so Stripe counts it once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import asyncpg
import stripe

log = logging.getLogger(__name__)

#: meter name -> (Stripe event name, what it sums over ``usage`` rows ``t``)
METERS: dict[str, tuple[str, str]] = {
    "input_tokens": ("kvgate_input_tokens", "{t}.prompt_tokens - {t}.cached_tokens"),
    "cached_input_tokens": ("kvgate_cached_input_tokens", "{t}.cached_tokens"),
    "output_tokens": ("kvgate_output_tokens", "{t}.completion_tokens"),
}
#: Stripe accepts meter events up to 35 days old; stay inside that.
MAX_AGE_DAYS = 30
#: An interval is closed this long after its end (usage rows are flushed within seconds).
SETTLE = timedelta(minutes=10)
HOUR = timedelta(hours=1)

Db = asyncpg.Pool | asyncpg.Connection


def hour_of(at: datetime) -> datetime:
    """The start of the UTC hour holding ``at``."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def closed_until(now: datetime) -> datetime:
    """Intervals ending at or before this instant can no longer change at ``now``."""
    return now.astimezone(UTC) - SETTLE


def identifier(team_id: int, meter: str, start: datetime) -> str:
    """The stable identifier of one team's usage on one meter in the interval from ``start``.

    A team's intervals never overlap, so their starts tell them apart. (Rows of the daily
    scheme keep their ``kvgate-<team>-<meter>-<YYYYMMDD>`` identifiers.)
    """
    at = start.astimezone(UTC)
    fraction = f".{at.microsecond:06d}" if at.microsecond else ""
    return f"kvgate-{team_id}-{meter}-{at:%Y%m%dT%H%M%S}{fraction}Z"


def split(
    start: datetime, end: datetime, cuts: Iterable[datetime]
) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` cut at every UTC hour mark and at every one of ``cuts`` inside it."""
    points = {c for c in cuts if start < c < end}
    mark = hour_of(start) + HOUR
    while mark < end:
        points.add(mark)
        mark += HOUR
    edges = [start, *sorted(points), end]
    return list(pairwise(edges))


def event_time(start: datetime, end: datetime) -> datetime:
    """The timestamp of the event for ``[start, end)``: its midpoint, down to the second.

    Stripe's period bounds are whole seconds and every interval lies between two of them, so
    this second falls in the same billing period as the interval (and in its UTC hour).
    """
    return (start + (end - start) / 2).replace(microsecond=0)


@dataclass(frozen=True)
class Interval:
    """One team's closed interval with usage, ready to be written as report rows."""

    team_id: int
    customer_id: str
    start: datetime
    end: datetime


@dataclass
class ReportResult:
    """What one reporting run did."""

    sent: list[str] = field(default_factory=list)
    already: int = 0
    failed: dict[str, str] = field(default_factory=dict)


def _sums(alias: str) -> str:
    return ", ".join(f"coalesce(sum({e.format(t=alias)}), 0)::bigint" for _, e in METERS.values())


_UTC_HOUR = "date_trunc('hour', u.ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
#: Usage inside a paid period (billing_periods) of a team with a Stripe customer: the only
#: usage that is billed. Periods of one team never overlap, so no row is counted twice.
_PAID_USAGE = """
FROM billing_periods b
JOIN stripe_customers c ON c.team_id = b.team_id
JOIN usage u ON u.team_id = b.team_id
     AND u.ts >= b.started_at AND u.ts < coalesce(b.ended_at, 'infinity'::timestamptz)
"""
#: The hours holding unplanned paid usage, per team, with the end of its latest report row.
_HOURS = f"""
SELECT b.team_id, c.customer_id, r.reported, {_UTC_HOUR} AS hour
{_PAID_USAGE}
LEFT JOIN LATERAL (
    SELECT max(m.ends_at) AS reported FROM meter_reports m WHERE m.team_id = b.team_id
) r ON true
WHERE u.ts >= greatest($1, r.reported) AND u.ts < $2
GROUP BY 1, 2, 3, 4
"""
#: The oldest paid usage that Stripe has not been sent yet: not planned into a report row, or
#: planned and not acknowledged (within the age Stripe still accepts).
_UNREPORTED = f"""
SELECT least(
    (SELECT min(u.ts) {_PAID_USAGE}
     LEFT JOIN LATERAL (
         SELECT max(m.ends_at) AS reported FROM meter_reports m WHERE m.team_id = b.team_id
     ) r ON true
     WHERE u.ts >= coalesce(r.reported, '-infinity'::timestamptz) AND u.ts >= $1),
    (SELECT min(event_time) FROM meter_reports WHERE sent_at IS NULL AND event_time >= $1)
)
"""
_PERIODS = """
SELECT team_id, started_at, ended_at FROM billing_periods
WHERE team_id = ANY($1::bigint[]) AND coalesce(ended_at, 'infinity'::timestamptz) > $2
"""
_SUBSCRIPTION_BOUNDS = """
SELECT team_id, current_period_start, current_period_end FROM stripe_subscriptions
WHERE team_id = ANY($1::bigint[])
"""
_INTERVAL_SUMS = f"""
SELECT s.i, {_sums("u")}
FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[]) WITH ORDINALITY
     AS s (team_id, starts_at, ends_at, i)
JOIN usage u ON u.team_id = s.team_id AND u.ts >= s.starts_at AND u.ts < s.ends_at
GROUP BY s.i
"""
_INSERT = """
INSERT INTO meter_reports (identifier, team_id, meter, customer_id, starts_at, ends_at,
                           event_time, value)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::timestamptz[],
                     $6::timestamptz[], $7::timestamptz[], $8::bigint[])
"""
_HOURLY_TOTALS = f"""
SELECT b.team_id, {_UTC_HOUR} AS hour, {_sums("u")}
{_PAID_USAGE}
WHERE u.ts >= $1 AND u.ts < $2
GROUP BY 1, 2
"""


async def hourly_totals(
    db: Db, since: datetime, until: datetime
) -> dict[tuple[int, str, datetime], int]:
    """Billed tokens per (team, meter, UTC hour) in ``[since, until)``, by the time of use."""
    totals: dict[tuple[int, str, datetime], int] = {}
    for r in await db.fetch(_HOURLY_TOTALS, since, until):
        for i, meter in enumerate(METERS):
            if r[2 + i]:
                totals[(r[0], meter, r[1])] = int(r[2 + i])
    return totals


async def report(db: Db, client: stripe.StripeClient, now: datetime) -> ReportResult:
    """Plan every closed interval not yet planned, then send every row not yet acknowledged.

    Safe to run at any time, as often as wanted and by several processes at once.
    """
    since = hour_of(now) - timedelta(days=MAX_AGE_DAYS)
    async with _transaction(db) as conn:
        planned = await _plan(conn, since, closed_until(now))
    if planned:
        log.info("planned %d meter report rows", planned)
    result = ReportResult()
    result.already = int(
        await db.fetchval(
            "SELECT count(*) FROM meter_reports WHERE sent_at IS NOT NULL AND event_time >= $1",
            since,
        )
    )
    unsent = await db.fetch(
        "SELECT identifier, meter, customer_id, event_time, value FROM meter_reports "
        "WHERE sent_at IS NULL AND event_time >= $1 ORDER BY event_time, identifier",
        since,
    )
    for row in unsent:
        try:
            await _send(db, client, row)
        except stripe.StripeError as exc:
            # Left unsent: the next run sends the same request again.
            log.warning("meter event %s not sent: %s", row["identifier"], exc.user_message)
            result.failed[row["identifier"]] = str(exc.user_message or exc)
            continue
        result.sent.append(row["identifier"])
    return result


async def _plan(conn: asyncpg.Connection, since: datetime, closed: datetime) -> int:
    """Write the report rows of every closed, unplanned interval with paid usage; how many.

    The lock makes planners take turns, so each sees the rows the previous one wrote and
    starts every team where its latest row ends: intervals never overlap.
    """
    await conn.execute("LOCK TABLE meter_reports IN SHARE ROW EXCLUSIVE MODE")
    hours = await conn.fetch(_HOURS, since, closed)
    if not hours:
        return 0
    teams = sorted({r["team_id"] for r in hours})
    periods: dict[int, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    cuts: dict[int, set[datetime]] = defaultdict(set)
    for team_id, started, ended in await conn.fetch(_PERIODS, teams, since):
        periods[team_id].append((started, ended))
        cuts[team_id].update(t for t in (started, ended) if t is not None)
    for team_id, *bounds in await conn.fetch(_SUBSCRIPTION_BOUNDS, teams):
        cuts[team_id].update(t for t in bounds if t is not None)
    intervals = [
        Interval(r["team_id"], r["customer_id"], start, end)
        for r in hours
        for start, end in _closed_pieces(
            r["hour"], r["reported"], since, closed, cuts[r["team_id"]]
        )
        if _paid(periods[r["team_id"]], start)
    ]
    if not intervals:
        return 0
    sums = await conn.fetch(
        _INTERVAL_SUMS,
        [i.team_id for i in intervals],
        [i.start for i in intervals],
        [i.end for i in intervals],
    )
    rows = [
        _row(intervals[s[0] - 1], meter, int(s[1 + k]))
        for s in sums
        for k, meter in enumerate(METERS)
        if s[1 + k] > 0
    ]
    if rows:
        await conn.execute(_INSERT, *(list(column) for column in zip(*rows, strict=True)))
    return len(rows)


def _row(it: Interval, meter: str, value: int) -> tuple[Any, ...]:
    """The ``meter_reports`` columns of ``meter``'s event for interval ``it``."""
    return (
        identifier(it.team_id, meter, it.start),
        it.team_id,
        meter,
        it.customer_id,
        it.start,
        it.end,
        event_time(it.start, it.end),
        value,
    )


def _closed_pieces(
    hour: datetime,
    reported: datetime | None,
    since: datetime,
    closed: datetime,
    cuts: set[datetime],
) -> list[tuple[datetime, datetime]]:
    """The closed, unplanned intervals of one team's ``hour``."""
    start = max(hour, since, reported or since)
    return [(a, b) for a, b in split(start, hour + HOUR, cuts) if b <= closed]


def _paid(periods: list[tuple[datetime, datetime | None]], start: datetime) -> bool:
    """Whether the interval from ``start`` lies in a paid period (it never straddles a bound)."""
    return any(s <= start and (e is None or start < e) for s, e in periods)


async def _send(db: Db, client: stripe.StripeClient, row: asyncpg.Record) -> None:
    if row["value"] > 0:  # daily rows of the old scheme may be 0: nothing to bill
        await client.v1.billing.meter_events.create_async(
            {
                "event_name": METERS[row["meter"]][0],
                "identifier": row["identifier"],
                "timestamp": int(row["event_time"].timestamp()),
                "payload": {
                    "stripe_customer_id": row["customer_id"],
                    "value": str(row["value"]),
                },
            },
            # The same key on every retry: Stripe replays the first answer.
            {"idempotency_key": row["identifier"]},
        )
    await db.execute(
        "UPDATE meter_reports SET sent_at = now() WHERE identifier = $1", row["identifier"]
    )


@asynccontextmanager
async def _transaction(db: Db) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on ``db``: on a connection of the pool, or on the connection itself."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():
            yield db


async def unreported_seconds(db: Db, now: datetime | None = None) -> float:
    """How long the oldest paid usage has waited for Stripe (0 when everything is sent).

    The reporter closes an hour :data:`SETTLE` after it ends and runs every few minutes, so
    a healthy system stays under about 1.5 h; more means reports are not going out.
    """
    now = now or datetime.now(UTC)
    oldest = await db.fetchval(_UNREPORTED, now - timedelta(days=MAX_AGE_DAYS))
    return 0.0 if oldest is None else max((now - oldest).total_seconds(), 0.0)
