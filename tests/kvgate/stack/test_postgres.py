"""The embedded Postgres stops with its last live user, even after a user died uncleanly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.commands import gone

USER = """
import sys, time
from pathlib import Path
from kvgate.stack.postgres import embedded_postgres
with embedded_postgres(Path(sys.argv[1])):
    print("attached", flush=True)
    if sys.argv[2] == "stay":
        time.sleep(120)
"""


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """Outside /tmp/pytest-of-<user>: see the ``home`` fixture of tests/e2e/test_up.py."""
    parent = Path(tempfile.mkdtemp(prefix="kvgate-pg-test-"))
    yield parent / "pg"
    shutil.rmtree(parent)


def _postmaster_pid(pg_dir: Path) -> int | None:
    pid_file = pg_dir / "postmaster.pid"
    return int(pid_file.read_text().split()[0]) if pid_file.exists() else None


def test_a_user_killed_while_attached_does_not_keep_the_server_alive(pg_dir: Path) -> None:
    crashed = subprocess.Popen(
        [sys.executable, "-c", USER, str(pg_dir), "stay"], stdout=subprocess.PIPE, text=True
    )
    assert crashed.stdout is not None and crashed.stdout.readline() == "attached\n"
    crashed.kill()  # SIGKILL: it never detaches, so pgserver still counts it as a user
    crashed.wait()
    postmaster = _postmaster_pid(pg_dir)
    assert postmaster is not None and psutil.pid_exists(postmaster)

    subprocess.run([sys.executable, "-c", USER, str(pg_dir), "leave"], check=True, timeout=120)

    assert _postmaster_pid(pg_dir) is None
    assert gone(postmaster)
