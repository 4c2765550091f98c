"""Console plan and billing page: the plans, the team's state, upgrade and manage billing.

Upgrading opens Stripe Checkout and "Manage billing" the Stripe customer portal; the plan
itself changes only when Stripe's signed webhook says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import stripe
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.billing import checkout, subscriptions
from gateway.pages import users
from gateway.pages.kit import PageKit, text_field

log = logging.getLogger(__name__)


class BillingViews:
    """Handlers for ``/console/teams/{id}/billing``."""

    def __init__(
        self, site: PageKit, stripe_client: Callable[[], stripe.StripeClient | None]
    ) -> None:
        self.site = site
        self._stripe = stripe_client

    async def page(
        self, request: Request, *, error: str | None = None, status: int = 400
    ) -> Response:
        """``GET /console/teams/{id}/billing``; with ``error``, that message and ``status``."""
        site = self.site
        user, team = await site.member(request)
        plans = await site.db.fetch(
            "SELECT name, requests_per_min, tokens_per_min, tokens_per_day, max_concurrent, "
            "monthly_price_cents FROM plans ORDER BY monthly_price_cents, requests_per_min"
        )
        account = await site.db.fetchrow(
            "SELECT state, grace_until FROM stripe_customers WHERE team_id = $1", team.team_id
        )
        return site.render(
            request,
            "console/billing.html",
            status if error else 200,
            user=user,
            team=team,
            teams=await users.memberships(site.db, user.id),
            plans=plans,
            buyable=set(site.config.billing.prices),
            state=account["state"] if account else "none",
            grace_until=account["grace_until"] if account else None,
            has_customer=account is not None,
            # A live subscription is changed in the portal, never by a second checkout.
            subscription=await subscriptions.live_subscription(site.db, team.team_id),
            checkout_state=request.query_params.get("checkout"),
            error=error,
        )

    async def _client(self, request: Request) -> stripe.StripeClient | Response:
        client = self._stripe()
        if client is None:
            return await self.page(
                request, error="Online payment is not set up on this installation."
            )
        return client

    async def upgrade(self, request: Request) -> Response:
        """``POST /console/teams/{id}/billing/checkout`` (owners): go to Stripe Checkout."""
        site = self.site
        user, team = await site.member(request, owner=True)
        client = await self._client(request)
        if isinstance(client, Response):
            return client
        plan = text_field(await request.form(), "plan")
        try:
            url = await checkout.checkout_url(
                site.db,
                client,
                site.config.billing,
                team_id=team.team_id,
                team_name=team.team,
                email=user.email,
                plan=plan,
                return_url=site.link(f"/console/teams/{team.team_id}/billing"),
            )
        except checkout.AlreadySubscribed as exc:
            return await self.page(request, error=str(exc), status=409)
        except checkout.CheckoutError as exc:
            return await self.page(request, error=str(exc))
        except stripe.StripeError as exc:
            log.warning("checkout for team %d failed: %s", team.team_id, exc)
            return await self.page(request, error="Stripe did not answer; try again shortly.")
        return RedirectResponse(url, status_code=303)

    async def portal(self, request: Request) -> Response:
        """``POST /console/teams/{id}/billing/portal`` (owners): go to the customer portal."""
        site = self.site
        user, team = await site.member(request, owner=True)
        client = await self._client(request)
        if isinstance(client, Response):
            return client
        try:
            url = await checkout.portal_url(
                site.db,
                client,
                team_id=team.team_id,
                team_name=team.team,
                email=user.email,
                return_url=site.link(f"/console/teams/{team.team_id}/billing"),
            )
        except stripe.StripeError as exc:
            log.warning("portal for team %d failed: %s", team.team_id, exc)
            return await self.page(request, error="Stripe did not answer; try again shortly.")
        return RedirectResponse(url, status_code=303)
