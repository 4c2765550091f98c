"""/admin/audit: the audit log, newest first, optionally about one target."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.admin import audit
from gateway.pages.kit import PageKit
from gateway.pages.sessions import SessionUser


class AuditViews:
    """The audit page (called with the signed-in staff user)."""

    def __init__(self, site: PageKit) -> None:
        self.site = site

    async def page(self, request: Request, user: SessionUser) -> Response:
        """The last 500 entries, or those about ``?target=``."""
        target = request.query_params.get("target", "").strip()
        entries = await audit.recent(self.site.db, 500, target)
        return self.site.render(
            request, "admin/audit.html", user=user, entries=entries, target=target
        )
