"""Console usage page (charts and tables) and its CSV download."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.console import usage_report
from gateway.pages import users
from gateway.pages.charts import Series, stacked_bars
from gateway.pages.kit import PageKit

_PERIODS = (7, 30, 90)


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
            requests_chart=requests_chart,
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
