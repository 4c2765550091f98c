"""CSRF protection for every form: a per-browser random cookie and an HMAC of it in the form.

The cookie is HttpOnly and SameSite=Lax; the form field is ``HMAC(secret, cookie)``. A
cross-site page can make the browser send the cookie but cannot read it or compute the
field, so its forged post arrives without a valid token and gets 403. This also covers
the forms used before signing in (login, sign-up), where there is no session yet. A post
whose ``Origin`` names another host than the one it was sent to is refused as well:
browsers send ``Origin`` with every form post, and no page can forge it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

COOKIE = "kvg_csrf"
FIELD = "csrf_token"

#: A Starlette request handler, as the routes and their guards wrap it.
Handler = Callable[[Request], Awaitable[Response]]


class Csrf:
    """Mints and checks form tokens with one secret shared by all replicas."""

    def __init__(self, secret: str, secure_cookies: bool) -> None:
        # No configured secret: a random one, so tokens only validate on this process.
        self._key = (secret or secrets.token_hex(32)).encode()
        self._secure = secure_cookies

    def _sign(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode(), hashlib.sha256).hexdigest()

    def token(self, request: Request) -> tuple[str, str | None]:
        """The form token for this browser, and a new cookie value to set (None if it has one)."""
        cookie = request.cookies.get(COOKIE)
        if cookie:
            return self._sign(cookie), None
        fresh = secrets.token_urlsafe(32)
        return self._sign(fresh), fresh

    def set_cookie(self, response: Response, value: str) -> None:
        """Give the browser its CSRF cookie."""
        response.set_cookie(
            COOKIE, value, httponly=True, samesite="lax", secure=self._secure, path="/"
        )

    def valid(self, request: Request, submitted: str | None) -> bool:
        """Whether ``submitted`` is the token of this browser's cookies, posted from a page
        of this host."""
        cookie = request.cookies.get(COOKIE)
        if not cookie or not submitted or not _same_origin(request):
            return False
        return hmac.compare_digest(self._sign(cookie), submitted)

    def protect(self, handler: Handler) -> Handler:
        """``handler`` behind a token check: 403 before it runs when the token is wrong."""

        @functools.wraps(handler)
        async def checked(request: Request) -> Response:
            form = await request.form()  # cached on the request: the handler reads it again
            submitted = form.get(FIELD)
            if not self.valid(request, submitted if isinstance(submitted, str) else None):
                return PlainTextResponse(
                    "This form has expired or did not come from this site (CSRF check "
                    "failed). Reload the page and submit it again.",
                    status_code=403,
                )
            return await handler(request)

        return checked


def _same_origin(request: Request) -> bool:
    """No ``Origin`` (not a browser, or an old one), or one naming the host posted to."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host")
