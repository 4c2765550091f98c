"""Metered usage to Stripe Billing Meters, from the daily usage roll-ups.

Three meters, so each can have its own price: uncached input tokens, cached input tokens
and output tokens. One meter event is sent per team, meter and closed UTC day, carrying
an identifier derived from exactly those three. Stripe counts an identifier once, so a
report that is retried (by stripe-python after a 5xx, by us after a crash, or by a second
reporter running at the same time) can never bill the same tokens twice. Only closed days
are sent: a day still collecting usage would need a second event that Stripe would drop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import stripe

log = logging.getLogger(__name__)

#: meter name -> (Stripe event name, what it sums over usage / usage_daily rows ``t``)
METERS: dict[str, tuple[str, str]] = {
    "input_tokens": ("kvgate_input_tokens", "{t}.prompt_tokens - {t}.cached_tokens"),
    "cached_input_tokens": ("kvgate_cached_input_tokens", "{t}.cached_tokens"),
    "output_tokens": ("kvgate_output_tokens", "{t}.completion_tokens"),
}
#: Stripe accepts meter events up to 35 days old; stay inside that.
MAX_AGE_DAYS = 30
#: A day is closed this long after midnight UTC (usage rows are flushed within seconds).
SETTLE = timedelta(minutes=10)


def identifier(team_id: int, meter: str, day: date) -> str:
    """The stable identifier of one team's usage on one meter for one UTC day."""
    return f"kvgate-{team_id}-{meter}-{day:%Y%m%d}"


def last_closed_day(now: datetime) -> date:
    """The latest UTC day whose usage can no longer change at ``now``."""
    return (now.astimezone(UTC) - SETTLE).date() - timedelta(days=1)


def day_start(day: date) -> int:
    """Unix time of 00:00 UTC on ``day``."""
    return int(datetime.combine(day, time(), UTC).timestamp())


@dataclass(frozen=True)
class Period:
    """One team's total on one meter for one day, and the Stripe customer paying for it."""

    team_id: int
    customer_id: str
    meter: str
    day: date
    value: int

    @property
    def identifier(self) -> str:
        """See :func:`identifier`."""
        return identifier(self.team_id, self.meter, self.day)


@dataclass
class ReportResult:
    """What one reporting run did."""

    sent: list[str] = field(default_factory=list)
    already: int = 0
    failed: dict[str, str] = field(default_factory=dict)


# Which tokens are billed: those used inside a paid period (billing_periods). Days wholly
# inside a period come from the daily roll-up; only the day a period starts or ends (where
# the roll-up cannot tell paid hours from free ones) is summed from the usage rows. The two
# conditions are exact complements, so no token is counted twice.
_DAY_START = "(d.day::timestamp AT TIME ZONE 'UTC')"
_DAY_END = "((d.day + 1)::timestamp AT TIME ZONE 'UTC')"
_ROW_DAY = "(u.ts AT TIME ZONE 'UTC')::date"
_ROW_DAY_START = f"({_ROW_DAY}::timestamp AT TIME ZONE 'UTC')"
_ROW_DAY_END = f"(({_ROW_DAY} + 1)::timestamp AT TIME ZONE 'UTC')"


def _sums(alias: str) -> str:
    return ", ".join(f"sum({expr.format(t=alias)})::bigint" for _, expr in METERS.values())


_TOTALS = f"""
WITH p AS (
    SELECT b.team_id, c.customer_id, b.started_at,
           coalesce(b.ended_at, 'infinity'::timestamptz) AS ended_at
    FROM billing_periods b JOIN stripe_customers c ON c.team_id = b.team_id
), whole AS (
    SELECT p.team_id, p.customer_id, d.day, {_sums("d")}
    FROM p JOIN usage_daily d ON d.team_id = p.team_id
         AND {_DAY_START} >= p.started_at AND {_DAY_END} <= p.ended_at
    WHERE d.day BETWEEN $1 AND $2
    GROUP BY 1, 2, 3
), edge AS (
    SELECT p.team_id, p.customer_id, {_ROW_DAY} AS day, {_sums("u")}
    FROM p JOIN usage u ON u.team_id = p.team_id
         AND u.ts >= p.started_at AND u.ts < p.ended_at
         AND NOT ({_ROW_DAY_START} >= p.started_at AND {_ROW_DAY_END} <= p.ended_at)
    WHERE u.ts >= ($1::date::timestamp AT TIME ZONE 'UTC')
      AND u.ts < (($2::date + 1)::timestamp AT TIME ZONE 'UTC')
    GROUP BY 1, 2, 3
)
SELECT team_id, customer_id, day, {", ".join(f"sum(m{i})::bigint" for i in range(len(METERS)))}
FROM (SELECT * FROM whole UNION ALL SELECT * FROM edge) AS t (team_id, customer_id, day,
      {", ".join(f"m{i}" for i in range(len(METERS)))})
GROUP BY 1, 2, 3 ORDER BY 3, 1
"""


async def local_totals(db: Any, since: date, through: date) -> list[Period]:
    """Per paying team, meter and day: the tokens used while on a paid subscription."""
    rows = await db.fetch(_TOTALS, since, through)
    return [
        Period(r[0], r[1], meter, r[2], int(r[3 + i]))
        for r in rows
        for i, meter in enumerate(METERS)
    ]


async def report(db: Any, client: stripe.StripeClient, now: datetime) -> ReportResult:
    """Send every closed day's usage not yet acknowledged by Stripe; safe to run any time."""
    through = last_closed_day(now)
    since = through - timedelta(days=MAX_AGE_DAYS)
    done = {
        r[0]
        for r in await db.fetch(
            "SELECT identifier FROM meter_reports WHERE sent_at IS NOT NULL AND day >= $1", since
        )
    }
    result = ReportResult()
    for period in await local_totals(db, since, through):
        if period.identifier in done:
            result.already += 1
            continue
        try:
            await _send(db, client, period)
        except stripe.StripeError as exc:
            # Left unsent: the next run sends it again under the same identifier.
            log.warning("meter event %s not sent: %s", period.identifier, exc.user_message)
            result.failed[period.identifier] = str(exc.user_message or exc)
            continue
        result.sent.append(period.identifier)
    return result


async def _send(db: Any, client: stripe.StripeClient, period: Period) -> None:
    await db.execute(
        "INSERT INTO meter_reports (identifier, team_id, meter, day, value) "
        "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (identifier) DO UPDATE SET value = $5",
        period.identifier,
        period.team_id,
        period.meter,
        period.day,
        period.value,
    )
    if period.value > 0:  # a zero event bills nothing and only costs a request
        event_name = METERS[period.meter][0]
        await client.v1.billing.meter_events.create_async(
            {
                "event_name": event_name,
                "identifier": period.identifier,
                # Noon of the day: inside the day whatever rounding Stripe applies.
                "timestamp": day_start(period.day) + 12 * 3600,
                "payload": {
                    "stripe_customer_id": period.customer_id,
                    "value": str(period.value),
                },
            },
            # The same key on every retry: Stripe replays the first answer.
            {"idempotency_key": period.identifier},
        )
    await db.execute(
        "UPDATE meter_reports SET sent_at = now() WHERE identifier = $1", period.identifier
    )
