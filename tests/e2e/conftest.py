"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import chromium  # noqa: F401 - a fixture of the browser tests
from tests.support.stack import processes_referencing


@pytest.fixture
def home() -> Iterator[Path]:
    """A fresh KVGATE_HOME; afterwards nothing may still run from it.

    Not under pytest's tmp_path: as root, the embedded Postgres runs as the user
    ``pgserver``, which must traverse every parent of its data directory, and each new
    pytest session on the machine resets /tmp/pytest-of-<user> to mode 0700.
    """
    path = Path(tempfile.mkdtemp(prefix="kvgate-up-test-")) / "home"
    yield path
    assert processes_referencing(path) == []
    shutil.rmtree(path.parent)
