"""The account, console and billing routes, listed in one place (explicit composition).

``gateway.app`` adds these to its own routes. Every POST here except the Stripe webhook
(authenticated by its signature) is a form behind the CSRF check; every console page is
behind the login guard, which sends anonymous browsers to the login page.
"""

from __future__ import annotations

import functools

import stripe
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.billing.client import stripe_client
from gateway.billing.webhooks import WebhookEndpoint
from gateway.console.billing import BillingViews
from gateway.console.keys import KeyViews
from gateway.console.members import MemberViews
from gateway.console.sign_in import AuthViews
from gateway.console.usage import TeamUsageViews
from gateway.pages.csrf import Handler
from gateway.pages.kit import LoginRequired, PageKit, login_redirect
from web import STATIC_DIR

WEBHOOK_PATH = "/billing/stripe/webhook"


def _guarded(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except LoginRequired:
            return login_redirect(request)

    return run


def console_routes(
    site: PageKit, stripe_http_client: stripe.HTTPClient | None = None
) -> list[BaseRoute]:
    """Routes for sign-in, the console and billing on ``site`` (shared with the public site
    and /admin, so one CSRF secret and one template environment serve every form).
    ``stripe_http_client`` is stripe-python's transport seam."""
    config = site.config
    client = (
        stripe_client(config.billing, stripe_http_client) if config.billing.secret_key else None
    )
    auth = AuthViews(site)
    keys = KeyViews(site)
    usage = TeamUsageViews(site)
    members = MemberViews(site)
    billing = BillingViews(site, lambda: client)
    form = site.csrf.protect
    page = _guarded

    def post(handler: Handler) -> Handler:
        return form(_guarded(handler))

    team = "/console/teams/{team_id:int}"
    return [
        Route("/signup", auth.signup_form, methods=["GET"]),
        Route("/signup", form(auth.signup), methods=["POST"]),
        Route("/verify", auth.verify, methods=["GET"]),
        Route("/login", auth.login_form, methods=["GET"]),
        Route("/login", form(auth.login), methods=["POST"]),
        Route("/logout", form(auth.logout), methods=["POST"]),
        Route("/password/forgot", auth.forgot_form, methods=["GET"]),
        Route("/password/forgot", form(auth.forgot), methods=["POST"]),
        Route("/password/reset", auth.reset_form, methods=["GET"]),
        Route("/password/reset", form(auth.reset), methods=["POST"]),
        Route("/invite", page(members.accept_form), methods=["GET"]),
        Route("/invite", post(members.accept), methods=["POST"]),
        Route("/console", page(keys.home), methods=["GET"]),
        Route(team, page(keys.team_home), methods=["GET"]),
        Route(team + "/keys", page(keys.list), methods=["GET"]),
        Route(team + "/keys", post(keys.create), methods=["POST"]),
        Route(team + "/keys/{key_id:int}/revoke", post(keys.revoke), methods=["POST"]),
        Route(team + "/usage", page(usage.page), methods=["GET"]),
        Route(team + "/usage.csv", page(usage.csv), methods=["GET"]),
        Route(team + "/members", page(members.page), methods=["GET"]),
        Route(team + "/members/invite", post(members.invite), methods=["POST"]),
        Route(team + "/members/{user_id:int}/remove", post(members.remove), methods=["POST"]),
        Route(team + "/billing", page(billing.page), methods=["GET"]),
        Route(team + "/billing/checkout", post(billing.upgrade), methods=["POST"]),
        Route(team + "/billing/portal", post(billing.portal), methods=["POST"]),
        Route(
            WEBHOOK_PATH, WebhookEndpoint(config.billing, lambda: site.db).handle, methods=["POST"]
        ),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
