"""The public site's routes, listed in one place (explicit composition).

``gateway.app`` adds these to its routes, on the one page kit
(``gateway.pages.kit.PageKit``: templates, CSRF, sessions, mail) the console and the staff
dashboard use too.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from gateway.config import GatewayConfig
from gateway.pages.kit import PageKit
from gateway.public.contact import THANKS_PATH, ContactViews
from gateway.public.pages import PublicPages
from gateway.public.playground import PlaygroundOps


def public_routes(config: GatewayConfig, site: PageKit) -> list[BaseRoute]:
    """Landing, benchmarks, pricing, API docs, the playground and the contact form on ``site``."""
    pages = PublicPages(site, config.site)
    contact = ContactViews(site, config.site, config.trusted_proxies)
    playground = PlaygroundOps(site, config)
    return [
        Route("/", pages.landing, methods=["GET"]),
        Route("/benchmarks", pages.benchmarks, methods=["GET"]),
        Route("/pricing", pages.pricing, methods=["GET"]),
        Route("/docs", pages.docs, methods=["GET"]),
        Route("/playground", pages.playground, methods=["GET"]),
        Route("/playground/prefill", playground.prefill, methods=["GET"]),
        Route("/playground/cold-storage", playground.cold_storage, methods=["POST"]),
        Route("/contact", contact.form, methods=["GET"]),
        Route("/contact", site.csrf.protect(contact.submit), methods=["POST"]),
        Route(THANKS_PATH, contact.thanks, methods=["GET"]),
    ]
