"""/admin/usage: tokens per day by plan over the last 30 days, and the top teams."""

from __future__ import annotations

from datetime import date
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.console import usage_report
from gateway.pages.charts import Series, stacked_bars
from gateway.pages.kit import PageKit
from gateway.pages.sessions import SessionUser

DAYS = 30
#: The plan of anonymous free-tier requests, which have no team.
ANONYMOUS = "free (anonymous)"


async def tokens_by_plan(db: Any, first: date) -> dict[str, dict[date, int]]:
    """plan -> day -> tokens (prompt + completion) since ``first``."""
    rows = await db.fetch(
        """
        SELECT coalesce(t.plan, $2), d.day, sum(d.prompt_tokens + d.completion_tokens)
        FROM usage_daily d LEFT JOIN teams t ON t.id = d.team_id
        WHERE d.day >= $1 GROUP BY 1, 2
        """,
        first,
        ANONYMOUS,
    )
    out: dict[str, dict[date, int]] = {}
    for plan, day, tokens in rows:
        out.setdefault(plan, {})[day] = int(tokens)
    return out


async def top_teams(db: Any, first: date, limit: int = 20) -> list[Any]:
    """The teams that used the most tokens since ``first``."""
    return await db.fetch(
        """
        SELECT t.id, t.name, t.plan, sum(d.requests) AS requests,
               sum(d.prompt_tokens) AS prompt, sum(d.cached_tokens) AS cached,
               sum(d.completion_tokens) AS completion
        FROM usage_daily d JOIN teams t ON t.id = d.team_id
        WHERE d.day >= $1 GROUP BY t.id ORDER BY sum(d.prompt_tokens + d.completion_tokens) DESC
        LIMIT $2
        """,
        first,
        limit,
    )


class PlanUsageViews:
    """The usage page (called with the signed-in staff user)."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    async def page(self, request: Request, user: SessionUser) -> Response:
        """The chart and the top-teams table."""
        days = usage_report.period(DAYS)
        by_plan = await tokens_by_plan(self.site.db, days[0])
        series = [
            Series(plan, f"s-plan-{i % 6}", [by_plan[plan].get(d, 0) for d in days])
            for i, plan in enumerate(sorted(by_plan))
        ]
        chart = stacked_bars("Tokens per day by plan", days, series)
        return self.site.render(
            request,
            "admin/usage.html",
            user=user,
            chart=chart,
            totals={s.label: sum(s.values) for s in series},
            top=await top_teams(self.site.db, days[0]),
        )
