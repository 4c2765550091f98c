"""What every page handler shares: the database, templates, CSRF, mail, and the guards.

Guards turn "who is this browser" into a redirect or a 404 before a handler does
anything: anonymous browsers go to the login page; a signed-in user asking for a team
they are not in gets 404 (not 403), so team ids cannot be probed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import asyncpg
import jinja2
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from gateway.client_ip import client_ip, free_tier_key
from gateway.config import Network
from gateway.pages import address_limit, email_links, sessions, users
from gateway.pages.config import AccountsConfig
from gateway.pages.csrf import Csrf
from gateway.pages.mailer import Email, Mailer
from gateway.pages.sessions import SessionUser
from gateway.pages.users import Membership
from web import TEMPLATES_DIR

log = logging.getLogger(__name__)


class LoginRequired(Exception):
    """Raised by :meth:`PageKit.user`; turned into a redirect to the login page."""


class PageKit:
    """Shared parts of the account and console pages."""

    def __init__(
        self,
        config: AccountsConfig,
        pool: Callable[[], asyncpg.Pool],
        mailer: Mailer,
        trusted_proxies: tuple[Network, ...] = (),
    ) -> None:
        self.config = config
        self._pool = pool
        self.mailer = mailer
        self._trusted_proxies = trusted_proxies
        self.csrf = Csrf(config.session_secret, config.secure_cookies)
        self.templates = template_environment()

    @property
    def db(self) -> asyncpg.Pool:
        """The gateway's connection pool (opened in its lifespan, hence the getter)."""
        return self._pool()

    def client_address(self, request: Request) -> str:
        """Who sent ``request``, as the per-address limits count it: the client's IPv4
        address or IPv6 /64 (``X-Forwarded-For`` believed from trusted proxies only)."""
        peer = request.client.host if request.client else None
        forwarded = request.headers.get("x-forwarded-for")
        return free_tier_key(client_ip(peer, forwarded, self._trusted_proxies))

    async def over_limit(self, request: Request, scope: str) -> float:
        """Count ``request`` against its address's limit on ``scope`` (sign-in, sign-up,
        password reset); 0 when within it, else the seconds to wait."""
        cfg = self.config
        client = self.client_address(request)
        return await address_limit.hit(
            self.db, scope, client, cfg.auth_per_address, cfg.auth_window_s
        )

    async def may_mail(self, purpose: email_links.Purpose, email: str) -> bool:
        """Whether another ``purpose`` link may go to ``email`` now (see ``mails_per_hour``)."""
        sent = await email_links.issued_recently(self.db, purpose, email, 3600)
        if sent >= self.config.mails_per_hour:
            log.warning(
                "not mailing another %s link to %s: %d in the last hour", purpose, email, sent
            )
            return False
        return True

    async def mail_link(
        self,
        purpose: email_links.Purpose,
        email: str,
        ttl_s: int,
        path: str,
        subject: str,
        text: Callable[[str], str],
        **owner: int | None,
    ) -> None:
        """Mail ``email`` a one-time ``purpose`` link to ``path``, valid for ``ttl_s``; the
        body is ``text(link)``. ``owner`` (user_id, team_id, invited_by) goes with the token.
        Callers check :meth:`may_mail` first: each answers a refusal its own way."""
        token = await email_links.issue(self.db, purpose, email, ttl_s, **owner)
        link = self.link(f"{path}?token={quote(token)}")
        await self.mailer.send(Email(email, subject, text(link)))

    def link(self, path: str) -> str:
        """An absolute URL on the public site, for emails."""
        return self.config.public_base_url.rstrip("/") + path

    def render(
        self,
        request: Request,
        template: str,
        status: int = 200,
        *,
        user: SessionUser | None = None,
        **context: Any,
    ) -> Response:
        """``template`` rendered with the CSRF token and user; pages are never cached."""
        token, new_cookie = self.csrf.token(request)
        html = self.templates.get_template(template).render(
            csrf_token=token, user=user, path=request.url.path, **context
        )
        response = HTMLResponse(html, status, headers={"cache-control": "no-store"})
        if new_cookie is not None:
            self.csrf.set_cookie(response, new_cookie)
        return response

    async def user(self, request: Request) -> SessionUser:
        """The signed-in user; raises :class:`LoginRequired` for anonymous browsers."""
        user = await sessions.user_for(self.db, request.cookies.get(sessions.COOKIE))
        if user is None:
            raise LoginRequired
        return user

    async def member(
        self, request: Request, *, owner: bool = False
    ) -> tuple[SessionUser, Membership]:
        """The user and their membership of the team in the path (404 when not a member).

        With ``owner``, a plain member gets 403: they may see the team, not change this.
        """
        user = await self.user(request)
        team_id = request.path_params["team_id"]
        membership = await users.membership(self.db, user.id, team_id)
        if membership is None:
            raise HTTPException(404, "No such team.")
        if owner and membership.role != "owner":
            raise HTTPException(403, "Only an owner of this team can do this.")
        return user, membership


def login_redirect(request: Request) -> Response:
    """Send an anonymous browser to the login page, coming back here afterwards."""
    target = request.url.path
    if request.url.query:
        target += "?" + request.url.query
    if request.method != "GET":
        target = "/console"
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


def template_environment() -> jinja2.Environment:
    """The pages' Jinja environment: autoescaped, strict about undefined names, with the
    filters the templates use (one place, so a template check compiles what is served)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["dollars"] = dollars
    return env


def dollars(value: Decimal, places: int | None = None) -> str:
    """``value`` as ``$1,234.50``: to ``places`` decimals, or as many as it has (at least 2)."""
    if places is None:
        exponent = value.normalize().as_tuple().exponent
        places = max(2, -exponent if isinstance(exponent, int) else 2)
    return f"${value:,.{places}f}"


def text_field(form: FormData, name: str, *, strip: bool = True) -> str:
    """Form field ``name`` as text ("" when absent or a file); passwords keep their spaces."""
    value = form.get(name)
    if not isinstance(value, str):
        return ""
    return value.strip() if strip else value


def safe_next(value: str | None) -> str:
    """A post-login destination that stays on this site (no open redirect)."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/console"
