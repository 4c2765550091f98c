"""The public site's and the staff dashboard's routes (explicit composition).

``gateway.app`` adds these to its routes. They reuse the accounts' page machinery
(``gateway.web.site.Site``: templates, CSRF, sessions, mail) rather than a copy of it.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from gateway.admin.routes import admin_routes
from gateway.config import GatewayConfig
from gateway.site.contact import THANKS_PATH, ContactViews
from gateway.site.pages import PublicPages
from gateway.web.site import Site


def site_routes(config: GatewayConfig, site: Site) -> list[BaseRoute]:
    """Public pages, the contact form and /admin on ``site`` (the one the accounts' routes
    use too)."""
    pages = PublicPages(site, config.site)
    contact = ContactViews(site, config.site, config.trusted_proxies)
    return [
        Route("/", pages.landing, methods=["GET"]),
        Route("/pricing", pages.pricing, methods=["GET"]),
        Route("/docs", pages.docs, methods=["GET"]),
        Route("/playground", pages.playground, methods=["GET"]),
        Route("/contact", contact.form, methods=["GET"]),
        Route("/contact", site.csrf.protect(contact.submit), methods=["POST"]),
        Route(THANKS_PATH, contact.thanks, methods=["GET"]),
        *admin_routes(site, config.site, config.worker_timeout_s),
    ]
