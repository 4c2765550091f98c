"""Helpers for the foundation tests that run ``kvgate`` commands as separate processes."""

from __future__ import annotations

import os
from pathlib import Path


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
