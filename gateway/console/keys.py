"""Console pages for API keys: list, create (the secret is shown once), revoke.

Keys are made and revoked through ``gateway.accounts``, the same code as ``kvgate admin``.
The secret exists only in the response to the create form: the database keeps its hash,
and the page carries ``Cache-Control: no-store`` so the browser does not keep it either.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway import accounts
from gateway.pages import users
from gateway.pages.kit import PageKit, text_field
from gateway.pages.sessions import SessionUser
from gateway.pages.users import Membership


class KeyViews:
    """Handlers for ``/console`` and ``/console/teams/{id}/keys``."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    async def home(self, request: Request) -> Response:
        """``GET /console``: the first team's keys (most users have one team)."""
        user = await self.site.user(request)
        teams = await users.memberships(self.site.db, user.id)
        if not teams:
            return self.site.render(
                request,
                "message.html",
                user=user,
                title="No team",
                message="You are not in any team. Ask a team owner for an invitation.",
            )
        return RedirectResponse(f"/console/teams/{teams[0].team_id}/keys", status_code=303)

    async def team_home(self, request: Request) -> Response:
        """``GET /console/teams/{id}``."""
        _, team = await self.site.member(request)
        return RedirectResponse(f"/console/teams/{team.team_id}/keys", status_code=303)

    async def _page(
        self,
        request: Request,
        user: SessionUser,
        team: Membership,
        *,
        secret: str | None = None,
        status: int = 200,
    ) -> Response:
        teams = await users.memberships(self.site.db, user.id)
        return self.site.render(
            request,
            "console/keys.html",
            status,
            user=user,
            team=team,
            teams=teams,
            keys=await accounts.team_keys(self.site.db, team.team_id),
            new_secret=secret,
        )

    async def list(self, request: Request) -> Response:
        """``GET /console/teams/{id}/keys``."""
        user, team = await self.site.member(request)
        return await self._page(request, user, team)

    async def create(self, request: Request) -> Response:
        """``POST /console/teams/{id}/keys``: mint a key and show its secret this once."""
        user, team = await self.site.member(request)
        name = text_field(await request.form(), "name")[:80]
        _, secret = await accounts.create_key(self.site.db, team.team, name)
        return await self._page(request, user, team, secret=secret, status=201)

    async def revoke(self, request: Request) -> Response:
        """``POST /console/teams/{id}/keys/{key_id}/revoke`` (owners: a plain member could
        otherwise cut off every key the team's services run on)."""
        _, team = await self.site.member(request, owner=True)
        key_id = request.path_params["key_id"]
        owned = await self.site.db.fetchval(
            "SELECT 1 FROM api_keys WHERE id = $1 AND team_id = $2", key_id, team.team_id
        )
        if owned is None:
            raise HTTPException(404, "No such key in this team.")
        await accounts.revoke_key(self.site.db, key_id)
        return RedirectResponse(f"/console/teams/{team.team_id}/keys", status_code=303)
