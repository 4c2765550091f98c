"""Helpers for the tests that run ``kvgate`` commands as separate processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil


def kvgate_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any kvgate/Postgres/S3 setting, plus ``KVGATE_HOME``.

    So that the stack under test starts its own embedded Postgres and SeaweedFS whatever
    the developer or CI exported. SeaweedFS needs ~25s to finish a graceful shutdown on
    its own, so the tests shorten the grace before SIGKILL.
    """
    drop = ("KVGATE_", "DATABASE_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY", "AWS_SECRET")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        KVGATE_HOME=str(home),
        KVGATE_CONFIG=str(home.parent / "absent.toml"),
        KVGATE_STOP_TIMEOUT="2",
        **extra,
    )
    return env


def gone(pid: int, deadline_s: float = 10.0) -> bool:
    """Whether process ``pid`` exits within the deadline.

    A zombie counts as exited: orphans (a service's helpers, pg_ctl's postmaster) are
    reaped by whatever PID 1 is, whenever it gets to it.
    """
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
