"""Compare what we billed locally with what Stripe's meters hold, per team, meter and hour.

Stripe's side is read back through its meter event summaries (grouped by UTC hour), so the
comparison checks what Stripe will actually bill, not what we believe we sent. Stripe
assigns usage to an invoice by the event's timestamp, so totals that agree per day can still
bill the wrong period (usage after a 14:37 renewal stamped at noon lands on the old invoice,
and arrives after it was finalized): comparing each hour's usage, by the time it was used,
with the events stamped in that hour catches such a shift as well as missing usage.

Rows of the old daily scheme carry a whole day in one event stamped at noon; a report row
that spans more than an hour is therefore compared as a whole, over the time it covers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

import stripe

from gateway.billing.client import BillingDisabled
from gateway.billing.config import BillingConfig
from gateway.billing.meters import (
    HOUR,
    MAX_AGE_DAYS,
    METERS,
    Db,
    closed_until,
    hour_of,
    hourly_totals,
)


@dataclass(frozen=True)
class Difference:
    """A window in which the local total and Stripe's total for a meter disagree."""

    team_id: int
    customer_id: str
    meter: str
    start: datetime
    end: datetime
    local: int
    stripe: int


@dataclass(frozen=True)
class Reconciliation:
    """The outcome: how many (team, meter, window) cells were compared and which differ."""

    since: datetime
    until: datetime
    compared: int
    differences: list[Difference]


async def reconcile(
    db: Db,
    client: stripe.StripeClient,
    config: BillingConfig,
    now: datetime,
    days: int = MAX_AGE_DAYS,
) -> Reconciliation:
    """Compare every closed hour of the last ``days`` UTC days for every Stripe customer.

    The window ends with the last hour closed at ``now`` and starts at midnight UTC, so a
    day reported whole (before reporting went hourly) is always inside it or outside it.
    """
    missing = [m for m in METERS if m not in config.meter_ids]
    if missing:
        raise BillingDisabled(
            f"no Stripe meter id for {', '.join(missing)}: set KVGATE_STRIPE_METER_IDS, "
            'e.g. {"input_tokens": "mtr_..."}'
        )
    until = hour_of(closed_until(now))
    first_day = (until - HOUR).date() - timedelta(days=days - 1)
    since = datetime.combine(first_day, time(), UTC)
    local = await hourly_totals(db, since, until)
    wide = await _wide_reports(db, since, until)
    hours = [since + k * HOUR for k in range(int((until - since) / HOUR))]
    customers = await db.fetch("SELECT team_id, customer_id FROM stripe_customers ORDER BY team_id")
    differences: list[Difference] = []
    compared = 0
    for team_id, customer in customers:
        for meter in METERS:
            remote = await _stripe_hours(client, config.meter_ids[meter], customer, since, until)
            cells: dict[tuple[datetime, datetime], list[int]] = {}
            for hour in hours:
                totals = cells.setdefault(_cell(wide.get(team_id, []), hour), [0, 0])
                totals[0] += local.get((team_id, meter, hour), 0)
                totals[1] += remote.get(hour, 0)
            compared += len(cells)
            differences.extend(
                Difference(team_id, customer, meter, start, end, mine, theirs)
                for (start, end), (mine, theirs) in cells.items()
                if mine != theirs
            )
    return Reconciliation(since, until, compared, differences)


def _cell(wide: list[tuple[datetime, datetime]], hour: datetime) -> tuple[datetime, datetime]:
    """The window ``hour`` is compared in: its own, or that of a wide report row covering it."""
    for start, end in wide:
        if start <= hour < end:
            return start, end
    return hour, hour + HOUR


async def _wide_reports(
    db: Db, since: datetime, until: datetime
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per team, the windows of report rows longer than an hour (the old daily scheme's)."""
    rows = await db.fetch(
        "SELECT DISTINCT team_id, starts_at, ends_at FROM meter_reports "
        "WHERE ends_at - starts_at > interval '1 hour' AND ends_at > $1 AND starts_at < $2",
        since,
        until,
    )
    wide: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for team_id, start, end in rows:
        wide[team_id].append((start, end))
    return wide


async def _stripe_hours(
    client: stripe.StripeClient, meter_id: str, customer: str, since: datetime, until: datetime
) -> dict[datetime, int]:
    """Stripe's total per UTC hour (by event timestamp) for ``customer`` on ``meter_id``."""
    summaries = await client.v1.billing.meters.event_summaries.list_async(
        meter_id,
        {
            "customer": customer,
            "start_time": int(since.timestamp()),
            "end_time": int(until.timestamp()),
            "value_grouping_window": "hour",
            "limit": 100,
        },
    )
    out: dict[datetime, int] = {}
    async for summary in summaries.auto_paging_iter():
        hour = datetime.fromtimestamp(summary.start_time, UTC)
        out[hour] = out.get(hour, 0) + round(summary.aggregated_value)
    return out
