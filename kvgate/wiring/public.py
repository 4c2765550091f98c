"""Map kvgate's Settings onto the public site's and the admin dashboard's config."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from gateway.pages.config import AccountsConfig
from gateway.public.config import SiteConfig
from kvgate.settings import Settings

#: Where `kvgate bench` writes its reports in a checkout.
DEFAULT_BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def site_config(settings: Settings) -> SiteConfig:
    """The site/admin section of ``settings``."""
    return SiteConfig(
        sales_email=settings.sales_email,
        contact_limit=settings.contact_form_limit,
        contact_window_s=settings.contact_form_window_s,
        uncontacted_after_s=settings.lead_uncontacted_after_s,
        benchmarks_dir=settings.benchmarks_dir or DEFAULT_BENCHMARKS,
    )


def one_secret_per_process(accounts: AccountsConfig) -> AccountsConfig:
    """``accounts`` with a random session secret when none is configured.

    Written when the console's and the site's pages were two ``PageKit`` objects, each of
    which turns an empty secret into its own random CSRF key. ``gateway.app.build_app``
    now makes one ``PageKit`` for all of them, so this only says at the composition root
    what ``Csrf`` does anyway: without a configured secret, one random key per process.
    """
    if accounts.session_secret:
        return accounts
    return replace(accounts, session_secret=secrets.token_hex(32))
