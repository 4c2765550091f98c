"""/admin/teams: every team's plan, usage and keys; suspend and unsuspend."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from gateway import accounts
from gateway.admin import audit, teams
from gateway.pages.kit import PageKit, text_field
from gateway.pages.sessions import SessionUser


class TeamViews:
    """Handlers of the teams pages (each called with the signed-in staff user)."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    async def list(self, request: Request, user: SessionUser) -> Response:
        """Teams, biggest users of the last 30 days first."""
        q = request.query_params.get("q", "").strip()
        rows = await teams.search_teams(self.site.db, q)
        return self.site.render(request, "admin/teams.html", user=user, teams=rows, q=q)

    async def detail(self, request: Request, user: SessionUser, error: str = "") -> Response:
        """One team: plan, usage, members, keys, suspension."""
        team_id = request.path_params["team_id"]
        team = await teams.get_team(self.site.db, team_id)
        if team is None:
            return PlainTextResponse("No such team.", status_code=404)
        return self.site.render(
            request,
            "admin/team.html",
            400 if error else 200,
            user=user,
            team=team,
            keys=await accounts.team_keys(self.site.db, team_id),
            history=await audit.recent(self.site.db, 50, f"team:{team_id}"),
            error=error,
        )

    async def suspend(self, request: Request, user: SessionUser) -> Response:
        """Block every key of the team."""
        reason = text_field(await request.form(), "reason")
        return await self._change(request, user, "team.suspend", reason)

    async def unsuspend(self, request: Request, user: SessionUser) -> Response:
        """Restore the keys the suspension blocked."""
        return await self._change(request, user, "team.unsuspend", "")

    async def _change(
        self, request: Request, user: SessionUser, action: str, reason: str
    ) -> Response:
        team_id = request.path_params["team_id"]
        try:
            async with self.site.db.acquire() as conn, conn.transaction():
                if await teams.get_team(conn, team_id) is None:
                    return PlainTextResponse("No such team.", status_code=404)
                if action == "team.suspend":
                    ids = await teams.suspend(conn, team_id, user.id, reason)
                    before, after = {"suspended": False}, {"suspended": True, "reason": reason}
                else:
                    ids = await teams.unsuspend(conn, team_id)
                    before, after = {"suspended": True}, {"suspended": False}
                after["keys"] = ids
                await audit.record(conn, user, action, f"team:{team_id}", before, after)
        except teams.TeamError as exc:
            return await self.detail(request, user, str(exc))
        return RedirectResponse(f"/admin/teams/{team_id}", status_code=303)
