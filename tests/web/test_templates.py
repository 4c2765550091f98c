"""The templates and static files the gateway serves: every template compiles, and every
static file a template links to exists."""

from __future__ import annotations

import re

import pytest

from gateway.pages.kit import template_environment
from web import STATIC_DIR, TEMPLATES_DIR

TEMPLATES = sorted(p.relative_to(TEMPLATES_DIR).as_posix() for p in TEMPLATES_DIR.rglob("*.html"))


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_compiles_and_links_only_static_files_that_exist(name: str) -> None:
    template_environment().get_template(
        name
    )  # a syntax error or a missing parent template raises here
    text = (TEMPLATES_DIR / name).read_text()
    missing = [
        path
        for path in re.findall(r"/static/([\w./-]+)", text)
        if not (STATIC_DIR / path).is_file()
    ]
    assert missing == []


def test_there_are_templates_to_check() -> None:
    assert len(TEMPLATES) > 20 and "base.html" in TEMPLATES
