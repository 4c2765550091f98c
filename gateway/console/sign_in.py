"""Sign-up, email verification, login, logout and password reset pages.

Error messages never reveal whether an email has an account (login and reset answer the
same either way); only sign-up must say so, because the person has to log in instead.
"""

from __future__ import annotations

import logging

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.console import throttle
from gateway.pages import email_links, passwords, sessions, users
from gateway.pages.kit import PageKit, safe_next, text_field

log = logging.getLogger(__name__)


class AuthViews:
    """Handlers for the pages a browser uses before (and to stop) being signed in."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    # --- sign-up and verification ------------------------------------------------------
    async def signup_form(self, request: Request) -> Response:
        """``GET /signup``."""
        return self.site.render(request, "signup.html", email="", team="", error=None)

    async def signup(self, request: Request) -> Response:
        """``POST /signup``: create the user and team, send the verification link."""
        if wait := await self.site.over_limit(request, "signup"):
            return self._too_many(request, wait)
        form = await request.form()
        email = users.normalize_email(text_field(form, "email"))
        team = text_field(form, "team")
        password = text_field(form, "password", strip=False)
        error = None
        if not users.is_valid_email(email):
            error = "Enter a valid email address, like you@example.com."
        elif not team or len(team) > 80:
            error = "Name your team (up to 80 characters)."
        else:
            try:
                passwords.check_strength(password)
                user_id = await users.sign_up(
                    self.site.db, email, await passwords.hash_password(password), team
                )
            except (passwords.WeakPassword, users.SignupError) as exc:
                error = str(exc)
        if error is not None:
            return self.site.render(
                request, "signup.html", 400, email=email, team=team, error=error
            )
        await self._send_verification(user_id, email)
        return self.site.render(request, "check_email.html", email=email)

    async def _send_verification(self, user_id: int, email: str) -> None:
        site = self.site
        if not await site.may_mail("verify", email):
            return
        await site.mail_link(
            "verify",
            email,
            site.config.email_link_ttl_s,
            "/verify",
            "Verify your email for kvgate",
            lambda link: (
                "Welcome to kvgate. Open this link to verify your email and sign in:"
                f"\n\n{link}\n\nIf you did not sign up, ignore this message."
            ),
            user_id=user_id,
        )

    async def verify(self, request: Request) -> Response:
        """``GET /verify?token=...``: mark the email verified and sign the user in."""
        site = self.site
        found = await email_links.consume(site.db, "verify", request.query_params.get("token", ""))
        if found is None or found.user_id is None:
            return site.render(
                request,
                "message.html",
                400,
                title="Link not valid",
                message="This verification link is used up or expired. Log in to get a new one.",
            )
        await users.mark_verified(site.db, found.user_id)
        return await self._signed_in(found.user_id, "/console")

    async def _signed_in(self, user_id: int, target: str) -> Response:
        cfg = self.site.config
        token = await sessions.start(self.site.db, user_id, cfg.session_ttl_s)
        response = RedirectResponse(target, status_code=303)
        sessions.set_cookie(response, token, cfg.session_ttl_s, cfg.secure_cookies)
        return response

    # --- login and logout ----------------------------------------------------------------
    async def login_form(self, request: Request) -> Response:
        """``GET /login``."""
        nxt = safe_next(request.query_params.get("next"))
        return self.site.render(request, "login.html", email="", next=nxt, error=None)

    async def login(self, request: Request) -> Response:
        """``POST /login``: throttled password check, then a new session."""
        site = self.site
        if wait := await site.over_limit(request, "login"):
            return self._too_many(request, wait)
        form = await request.form()
        email = users.normalize_email(text_field(form, "email"))
        nxt = safe_next(text_field(form, "next"))
        password = text_field(form, "password", strip=False)
        client = site.client_address(request)
        wait = await throttle.claim(site.db, email, client, site.config.login_free_failures)
        if wait > 0:
            response = site.render(
                request,
                "login.html",
                429,
                email=email,
                next=nxt,
                error=f"Too many failed attempts. Wait {int(wait) + 1} seconds and try again, "
                "or reset your password.",
            )
            response.headers["retry-after"] = str(int(wait) + 1)
            return response
        found = await users.credentials(site.db, email)
        ok = await passwords.verify_password(found.password_hash if found else None, password)
        if not ok or found is None:  # counted as failed already, by the claim
            return site.render(
                request,
                "login.html",
                401,
                email=email,
                next=nxt,
                error="Wrong email or password.",
            )
        await throttle.succeeded(site.db, email, client)
        if not found.verified:
            await self._send_verification(found.id, found.email)
            return site.render(request, "check_email.html", 403, email=found.email)
        return await self._signed_in(found.id, nxt)

    async def logout(self, request: Request) -> Response:
        """``POST /logout``."""
        await sessions.end(self.site.db, request.cookies.get(sessions.COOKIE))
        response = RedirectResponse("/login", status_code=303)
        sessions.clear_cookie(response, self.site.config.secure_cookies)
        return response

    # --- password reset ------------------------------------------------------------------
    async def forgot_form(self, request: Request) -> Response:
        """``GET /password/forgot``."""
        return self.site.render(request, "forgot.html", sent=False)

    async def forgot(self, request: Request) -> Response:
        """``POST /password/forgot``: the same answer for every address, at once; the reset
        link goes out afterwards when the account exists, so the time to answer does not
        tell which addresses have accounts."""
        if wait := await self.site.over_limit(request, "forgot"):
            return self._too_many(request, wait)
        email = users.normalize_email(text_field(await request.form(), "email"))
        if not users.is_valid_email(email):
            return self.site.render(
                request, "forgot.html", 400, sent=False, error="Enter a valid email address."
            )
        response = self.site.render(request, "forgot.html", sent=True)
        response.background = BackgroundTask(self._mail_reset, email)
        return response

    async def _mail_reset(self, email: str) -> None:
        try:
            await self._send_reset(email)
        except Exception:  # after the answer went out: nobody else would hear of it
            log.exception("password reset mail to %s failed", email)

    async def _send_reset(self, email: str) -> None:
        site = self.site
        found = await users.credentials(site.db, email)
        if found is not None and await site.may_mail("reset", email):
            await site.mail_link(
                "reset",
                email,
                site.config.reset_link_ttl_s,
                "/password/reset",
                "Reset your kvgate password",
                lambda link: (
                    "Open this link within the hour to choose a new password:"
                    f"\n\n{link}\n\nIf you did not ask for this, ignore this message."
                ),
                user_id=found.id,
            )

    def _too_many(self, request: Request, wait: float) -> Response:
        """429: this address sent the form too often; a page that says when to come back."""
        seconds = int(wait) + 1
        response = self.site.render(
            request,
            "message.html",
            429,
            title="Too many attempts",
            message=f"Too many attempts from your address. Try again in {seconds} seconds.",
        )
        response.headers["retry-after"] = str(seconds)
        return response

    async def reset_form(self, request: Request) -> Response:
        """``GET /password/reset?token=...``."""
        token = request.query_params.get("token", "")
        if await email_links.peek(self.site.db, "reset", token) is None:
            return self._bad_reset(request)
        return self.site.render(request, "reset.html", token=token, error=None)

    def _bad_reset(self, request: Request) -> Response:
        return self.site.render(
            request,
            "message.html",
            400,
            title="Link not valid",
            message="This reset link is used up or expired; ask for a new one.",
        )

    async def reset(self, request: Request) -> Response:
        """``POST /password/reset``: set the password, end old sessions, sign in."""
        site = self.site
        form = await request.form()
        token = text_field(form, "token")
        password = text_field(form, "password", strip=False)
        try:
            passwords.check_strength(password)
        except passwords.WeakPassword as exc:
            return site.render(request, "reset.html", 400, token=token, error=str(exc))
        found = await email_links.consume(site.db, "reset", token)
        if found is None or found.user_id is None:
            return self._bad_reset(request)
        await users.set_password(site.db, found.user_id, await passwords.hash_password(password))
        await sessions.end_all(site.db, found.user_id)
        await throttle.reset(site.db, found.email)  # the owner proved the address
        # Following the emailed link proves the address, like verification does.
        await users.mark_verified(site.db, found.user_id)
        return await self._signed_in(found.user_id, "/console")
