"""Compare what we metered locally with what Stripe's meters hold, per team, meter and day.

Stripe's side is read back through its meter event summaries (one request per customer and
meter, grouped by UTC day), so the comparison checks what Stripe will actually bill, not
what we believe we sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import stripe

from gateway.billing.client import BillingDisabled
from gateway.billing.config import BillingConfig
from gateway.billing.meters import MAX_AGE_DAYS, METERS, day_start, last_closed_day, local_totals


@dataclass(frozen=True)
class Difference:
    """A day on which the local total and Stripe's total for a meter disagree."""

    team_id: int
    customer_id: str
    meter: str
    day: date
    local: int
    stripe: int


@dataclass(frozen=True)
class Reconciliation:
    """The outcome: how many (team, meter, day) cells were compared and which differ."""

    since: date
    through: date
    compared: int
    differences: list[Difference]


async def reconcile(
    db: Any,
    client: stripe.StripeClient,
    config: BillingConfig,
    now: datetime,
    days: int = MAX_AGE_DAYS,
) -> Reconciliation:
    """Compare the last ``days`` closed days for every team that has a Stripe customer."""
    missing = [m for m in METERS if m not in config.meter_ids]
    if missing:
        raise BillingDisabled(
            f"no Stripe meter id for {', '.join(missing)}: set KVGATE_STRIPE_METER_IDS, "
            'e.g. {"input_tokens": "mtr_..."}'
        )
    through = last_closed_day(now)
    since = through - timedelta(days=days - 1)
    local = {(p.team_id, p.meter, p.day): p.value for p in await local_totals(db, since, through)}
    customers = await db.fetch("SELECT team_id, customer_id FROM stripe_customers ORDER BY team_id")
    differences: list[Difference] = []
    compared = 0
    for team_id, customer in customers:
        for meter in METERS:
            remote = await _stripe_days(client, config.meter_ids[meter], customer, since, through)
            for offset in range((through - since).days + 1):
                day = since + timedelta(days=offset)
                mine, theirs = local.get((team_id, meter, day), 0), remote.get(day, 0)
                compared += 1
                if mine != theirs:
                    differences.append(Difference(team_id, customer, meter, day, mine, theirs))
    return Reconciliation(since, through, compared, differences)


async def _stripe_days(
    client: stripe.StripeClient, meter_id: str, customer: str, since: date, through: date
) -> dict[date, int]:
    summaries = await client.v1.billing.meters.event_summaries.list_async(
        meter_id,
        {
            "customer": customer,
            "start_time": day_start(since),
            "end_time": day_start(through + timedelta(days=1)),
            "value_grouping_window": "day",
            "limit": 100,
        },
    )
    out: dict[date, int] = {}
    async for summary in summaries.auto_paging_iter():
        day = datetime.fromtimestamp(summary.start_time, UTC).date()
        out[day] = out.get(day, 0) + round(summary.aggregated_value)
    return out
