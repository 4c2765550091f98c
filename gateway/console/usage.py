"""Console usage page (charts and tables) and its CSV download.

Besides tokens and requests per day, the page shows the cached input per day by the tier it
came back from, and what caching saved: cached input billed at the cached price instead of
the input price (``BillingConfig.token_prices``, the figures of the metered Stripe prices).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.console import usage_report
from gateway.pages import users
from gateway.pages.charts import Series, stacked_bars
from gateway.pages.kit import PageKit

_PERIODS = (7, 30, 90)
#: how the page names each tier (protocol/tiers.py)
TIER_LABELS = {"device": "GPU", "host": "host RAM", "nas": "NAS", "object": "object store"}


class TeamUsageViews:
    """Handlers for ``/console/teams/{id}/usage`` and ``usage.csv``."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    @staticmethod
    def _days(request: Request) -> int:
        asked = request.query_params.get("days", "30")
        return int(asked) if asked.isdigit() and int(asked) in _PERIODS else 30

    async def page(self, request: Request) -> Response:
        """``GET /console/teams/{id}/usage?days=N``."""
        site = self.site
        user, team = await site.member(request)
        days = usage_report.period(self._days(request))
        # One snapshot for every table on the page, so a request that lands while it
        # renders shows up in all of them or in none.
        async with (
            site.db.acquire() as db,
            db.transaction(isolation="repeatable_read", readonly=True),
        ):
            daily = await usage_report.daily(db, team.team_id, days)
            by_key = await usage_report.by_key(db, team.team_id, days[0])
            recent = await usage_report.recent(db, team.team_id)
        tokens_chart = stacked_bars(
            "Tokens per day",
            days,
            [
                Series("uncached input", "s-input", [d.uncached_input for d in daily]),
                Series("cached input", "s-cached", [d.cached_input for d in daily]),
                Series("output", "s-output", [d.output for d in daily]),
            ],
        )
        unrecorded = [d.tier_unrecorded for d in daily]
        tiers_chart = stacked_bars(
            "Cached input tokens per day, by tier",
            days,
            [
                *(
                    Series(label, f"s-{tier}", [d.cached_by_tier[tier] for d in daily])
                    for tier, label in TIER_LABELS.items()
                ),
                *([Series("tier not recorded", "s-cached", unrecorded)] if any(unrecorded) else []),
            ],
        )
        requests_chart = stacked_bars(
            "Requests per day",
            days,
            [Series("requests", "s-requests", [d.requests for d in daily])],
        )
        return site.render(
            request,
            "console/usage.html",
            user=user,
            team=team,
            teams=await users.memberships(site.db, user.id),
            periods=_PERIODS,
            days=len(days),
            daily=[d for d in reversed(daily) if d.requests],
            by_key=by_key,
            recent=recent,
            tokens_chart=tokens_chart,
            tiers_chart=tiers_chart,
            requests_chart=requests_chart,
            tier_labels=TIER_LABELS,
            any_unrecorded=any(unrecorded),
            prices=site.config.billing.token_prices,
            saved=site.config.billing.token_prices.cached_saving(
                sum(d.cached_input for d in daily)
            ),
        )

    async def csv(self, request: Request) -> Response:
        """``GET /console/teams/{id}/usage.csv?days=N``: daily usage per model."""
        _, team = await self.site.member(request)
        days = usage_report.period(self._days(request))
        body = await usage_report.csv_rows(self.site.db, team.team_id, days[0])
        return Response(
            body,
            media_type="text/csv",
            headers={
                "content-disposition": f'attachment; filename="usage-team-{team.team_id}.csv"',
                "cache-control": "no-store",
            },
        )
