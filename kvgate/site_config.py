"""Map kvgate's Settings onto the public site's and the admin dashboard's config."""

from __future__ import annotations

from pathlib import Path

from gateway.site.config import SiteConfig
from kvgate.settings import Settings

#: Where `kvgate bench` writes its reports in a checkout.
DEFAULT_BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def site_config(settings: Settings) -> SiteConfig:
    """The site/admin section of ``settings``."""
    return SiteConfig(
        sales_email=settings.sales_email,
        contact_limit=settings.contact_form_limit,
        contact_window_s=settings.contact_form_window_s,
        uncontacted_after_s=settings.lead_uncontacted_after_s,
        benchmarks_dir=settings.benchmarks_dir or DEFAULT_BENCHMARKS,
    )
