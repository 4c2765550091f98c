"""Staff only: every /admin handler runs behind :func:`staff_only`.

Anonymous browsers go to the login page (as in the console); a signed-in user who is not
staff gets 404, so the dashboard's pages cannot even be confirmed to exist.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway.pages.csrf import Handler
from gateway.pages.kit import LoginRequired, PageKit, login_redirect
from gateway.pages.sessions import SessionUser

StaffHandler = Callable[[Request, SessionUser], Awaitable[Response]]


async def is_staff(db: Any, user_id: int) -> bool:
    """Whether user ``user_id`` is staff."""
    return bool(await db.fetchval("SELECT is_staff FROM users WHERE id = $1", user_id))


def staff_only(site: PageKit, handler: StaffHandler) -> Handler:
    """``handler`` called with the signed-in staff user; others never reach it."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        try:
            user = await site.user(request)
        except LoginRequired:
            return login_redirect(request)
        if not await is_staff(site.db, user.id):
            return PlainTextResponse("Not Found", status_code=404)
        return await handler(request, user)

    return run
