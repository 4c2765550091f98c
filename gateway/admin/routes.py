"""The /admin routes, listed in one place; every one is staff only, every POST needs CSRF."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.admin.audit_views import AuditViews
from gateway.admin.guard import StaffHandler, staff_only
from gateway.admin.leads_views import LeadViews
from gateway.admin.teams_views import TeamViews
from gateway.admin.tiers_views import TierViews
from gateway.admin.usage_views import PlanUsageViews
from gateway.pages.csrf import Handler
from gateway.pages.kit import PageKit
from gateway.pages.sessions import SessionUser
from gateway.public.config import SiteConfig


async def _home(request: Request, user: SessionUser) -> Response:
    return RedirectResponse("/admin/leads", status_code=303)


def admin_routes(site: PageKit, config: SiteConfig, worker_timeout_s: float) -> list[BaseRoute]:
    """Routes of the staff dashboard over ``site`` (templates, CSRF, database)."""
    leads = LeadViews(site, config)
    teams = TeamViews(site)
    tiers = TierViews(site, config, worker_timeout_s)
    usage = PlanUsageViews(site)
    audit = AuditViews(site)

    def page(handler: StaffHandler) -> Handler:
        return staff_only(site, handler)

    def post(handler: StaffHandler) -> Handler:
        return site.csrf.protect(staff_only(site, handler))

    lead = "/admin/leads/{lead_id:int}"
    team = "/admin/teams/{team_id:int}"
    return [
        Route("/admin", page(_home), methods=["GET"]),
        Route("/admin/leads", page(leads.list), methods=["GET"]),
        Route("/admin/leads.csv", page(leads.export), methods=["GET"]),
        Route(lead, page(leads.detail), methods=["GET"]),
        Route(lead, post(leads.update), methods=["POST"]),
        Route(lead + "/notes", post(leads.note), methods=["POST"]),
        Route("/admin/teams", page(teams.list), methods=["GET"]),
        Route(team, page(teams.detail), methods=["GET"]),
        Route(team + "/suspend", post(teams.suspend), methods=["POST"]),
        Route(team + "/unsuspend", post(teams.unsuspend), methods=["POST"]),
        Route("/admin/workers", page(tiers.page), methods=["GET"]),
        Route("/admin/usage", page(usage.page), methods=["GET"]),
        Route("/admin/audit", page(audit.page), methods=["GET"]),
    ]
