"""The browser the end-to-end tests drive: Debian's Chromium, headless, on a closed network."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PHONE = {"width": 390, "height": 844}

#: mark a browser test module with ``pytestmark = needs_chromium``: without the browser it
#: fails and says how to install it (``make test`` checks first), never skips silently
needs_chromium = pytest.mark.usefixtures("chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, which the browser tests drive."""
    assert CHROMIUM.exists(), (
        "the browser tests need Debian's chromium: apt-get install -y chromium"
    )
    return CHROMIUM
