"""Console members page, invitations by email, and accepting an invitation.

An invitation is an emailed single-use link bound to the invited address: only a
signed-in user with that (verified) email can accept it, and it makes them a member.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.pages import email_links, users
from gateway.pages.kit import PageKit, text_field
from gateway.pages.sessions import SessionUser
from gateway.pages.users import Membership


class MemberViews:
    """Handlers for ``/console/teams/{id}/members`` and ``/invite``."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    async def _page(
        self,
        request: Request,
        user: SessionUser,
        team: Membership,
        *,
        notice: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        db = self.site.db
        return self.site.render(
            request,
            "console/members.html",
            status,
            user=user,
            team=team,
            teams=await users.memberships(db, user.id),
            members=await users.members(db, team.team_id),
            invites=await email_links.pending_invites(db, team.team_id),
            notice=notice,
            error=error,
        )

    async def page(self, request: Request) -> Response:
        """``GET /console/teams/{id}/members``."""
        user, team = await self.site.member(request)
        return await self._page(request, user, team)

    async def remove(self, request: Request) -> Response:
        """``POST /console/teams/{id}/members/{user_id}/remove`` (owners): take someone out
        of the team; their sessions stay, but the team's pages and keys are no longer theirs."""
        user, team = await self.site.member(request, owner=True)
        try:
            await users.remove_member(self.site.db, team.team_id, request.path_params["user_id"])
        except users.MembershipError as exc:
            return await self._page(request, user, team, error=str(exc), status=400)
        return RedirectResponse(f"/console/teams/{team.team_id}/members", status_code=303)

    async def invite(self, request: Request) -> Response:
        """``POST /console/teams/{id}/members/invite`` (owners): email an invitation."""
        site = self.site
        user, team = await site.member(request, owner=True)
        email = users.normalize_email(text_field(await request.form(), "email"))
        if not users.is_valid_email(email):
            return await self._page(
                request, user, team, error="Enter a valid email address to invite.", status=400
            )
        if not await site.may_mail("invite", email):
            return await self._page(
                request,
                user,
                team,
                error=f"{email} was invited often enough; try later.",
                status=429,
            )
        await site.mail_link(
            "invite",
            email,
            site.config.email_link_ttl_s,
            "/invite",
            f"Join {team.team} on kvgate",
            lambda link: (
                f"{user.email} invites you to the team {team.team} on kvgate.\n\n"
                f"Sign up or log in with this email address, then open:\n\n{link}"
            ),
            team_id=team.team_id,
            invited_by=user.id,
        )
        return await self._page(request, user, team, notice=f"Invitation sent to {email}.")

    async def accept_form(self, request: Request) -> Response:
        """``GET /invite?token=...``: confirm joining (sign in first if needed)."""
        site = self.site
        user = await site.user(request)
        token = request.query_params.get("token", "")
        found = await email_links.peek(site.db, "invite", token)
        if found is None or found.team_id is None or found.email != user.email:
            return self._invalid(request, user)
        team = await site.db.fetchval("SELECT name FROM teams WHERE id = $1", found.team_id)
        return site.render(request, "invite.html", user=user, token=token, team_name=team)

    def _invalid(self, request: Request, user: SessionUser) -> Response:
        return self.site.render(
            request,
            "message.html",
            400,
            user=user,
            title="Invitation not valid",
            message="This invitation is used up, expired, or for another email address "
            "than the one you are signed in with.",
        )

    async def accept(self, request: Request) -> Response:
        """``POST /invite``: join the team of a valid invitation for this user's email."""
        site = self.site
        user = await site.user(request)
        token = text_field(await request.form(), "token")
        found = await email_links.peek(site.db, "invite", token)
        if found is None or found.team_id is None or found.email != user.email:
            return self._invalid(request, user)
        if await email_links.consume(site.db, "invite", token) is None:
            return self._invalid(request, user)
        await users.add_member(site.db, user.id, found.team_id, "member")
        return RedirectResponse(f"/console/teams/{found.team_id}/keys", status_code=303)
