"""The contact-sales form: honeypot and per-IP limit, store the lead, then tell sales.

The lead row is committed before the notification is attempted, and a failed email is
logged, not raised: whatever the mail server does, a valid submission is never lost (the
row's ``notified_at`` stays empty, and the lead shows up in /admin all the same).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.client_ip import client_ip
from gateway.config import Network
from gateway.pages.kit import PageKit, text_field
from gateway.pages.mailer import Email
from gateway.public import leads
from gateway.public.config import SiteConfig

log = logging.getLogger(__name__)

THANKS_PATH = "/contact/thanks"


class ContactViews:
    """``GET``/``POST /contact`` and the confirmation page."""

    def __init__(self, site: PageKit, config: SiteConfig, trusted: tuple[Network, ...]) -> None:
        self.site = site
        self.config = config
        self.trusted = trusted

    def _form(self, request: Request, status: int = 200, **context: object) -> Response:
        context.setdefault("values", {})
        context.setdefault("errors", {})
        return self.site.render(
            request,
            "site/contact.html",
            status,
            team_sizes=leads.TEAM_SIZES,
            monthly_tokens=leads.MONTHLY_TOKENS,
            honeypot=leads.HONEYPOT,
            **context,
        )

    async def form(self, request: Request) -> Response:
        """The empty form."""
        return self._form(request)

    async def submit(self, request: Request) -> Response:
        """Store a valid submission and notify sales; re-show the form with problems."""
        form = await request.form()
        if text_field(form, leads.HONEYPOT):
            log.warning("contact form: honeypot filled, submission dropped")
            return self.site.render(
                request,
                "message.html",
                400,
                title="Not sent",
                message="This submission looks automated and was not accepted. If you are "
                "a person, reload the page and send the form without autofill.",
            )
        lead, errors = leads.LeadForm.parse(form)
        if errors:
            return self._form(request, 400, values=lead.as_dict(), errors=errors)
        peer = request.client.host if request.client else None
        ip = client_ip(peer, request.headers.get("x-forwarded-for"), self.trusted)
        cfg = self.config
        try:
            lead_id = await leads.store(
                self.site.db, lead, ip, cfg.contact_limit, cfg.contact_window_s
            )
        except leads.ContactLimited:
            return self._form(
                request,
                429,
                values=lead.as_dict(),
                errors={
                    "form": "Too many messages from your network recently; please try again "
                    f"in an hour or write to {cfg.sales_email}."
                },
            )
        await self._notify(lead_id, lead)
        return RedirectResponse(THANKS_PATH, status_code=303)

    async def _notify(self, lead_id: int, lead: leads.LeadForm) -> None:
        body = "\n".join(
            [
                f"New lead #{lead_id} from the contact form:",
                "",
                *(f"{name.replace('_', ' ')}: {value}" for name, value in lead.as_dict().items()),
                "",
                f"Follow it up at {self.site.link(f'/admin/leads/{lead_id}')}",
            ]
        )
        email = Email(self.config.sales_email, f"New lead: {lead.company} ({lead.name})", body)
        try:
            await self.site.mailer.send(email)
        except Exception:  # any mail failure: the lead is stored already
            log.exception("lead %d stored but the sales notification failed", lead_id)
            return
        await leads.mark_notified(self.site.db, lead_id)

    async def thanks(self, request: Request) -> Response:
        """The confirmation page."""
        return self.site.render(request, "site/thanks.html")
