"""Settings of the public site and the admin dashboard: filled by ``kvgate`` or by tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SiteConfig:
    """What the public pages and /admin need to know; every field has a usable default."""

    #: Where new-lead notifications go (SMTP settings are the accounts' ones).
    sales_email: str = "sales@localhost"
    #: Contact-form submissions accepted from one client address per window.
    contact_limit: int = 5
    contact_window_s: float = 3600.0
    #: Playground moves to cold storage accepted from one caller (address or team) per window.
    cold_storage_limit: int = 10
    cold_storage_window_s: float = 600.0
    #: A lead still "new" after this long is flagged as uncontacted in the pipeline.
    uncontacted_after_s: float = 2 * 24 * 3600.0
    #: Where `kvgate bench` writes its figures (JSON and Markdown); the landing page shows
    #: them when present. None: no figures section.
    benchmarks_dir: Path | None = None
    #: Seconds to wait for a worker's /metrics on the workers-and-tiers page.
    metrics_timeout_s: float = 2.0
