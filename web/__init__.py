"""Templates and static assets served by the gateway (public site, console, admin).

A data package: code elsewhere finds its files through the two paths below, so the
gateway works the same from a checkout and from an installed wheel.
"""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"
