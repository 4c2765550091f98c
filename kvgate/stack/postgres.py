"""PostgreSQL: the configured ``DATABASE_URL``, or an embedded server from ``pgserver``.

The embedded server keeps its data in ``$KVGATE_HOME/pg`` and survives restarts. Several
processes may ask for it at once: ``pgserver`` attaches to a running postmaster on the same
data directory instead of starting a second one.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg


@contextlib.contextmanager
def embedded_postgres(pg_dir: Path, *, keep_running: bool = False) -> Iterator[str]:
    """Start (or attach to) the embedded PostgreSQL in ``pg_dir`` and yield its DSN.

    On exit the server is stopped unless another process still uses it or
    ``keep_running`` is set.
    """
    with warnings.catch_warnings():
        # pgserver keeps its lock file in the XDG runtime dir and falls back to /tmp when
        # XDG_RUNTIME_DIR is unset (containers, CI): fine for us, so no warning on every run
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver  # heavy import, only when the embedded server is wanted

    pg_dir = Path(pg_dir).absolute()
    pg_dir.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pg_dir)
    server = pgserver.get_server(pg_dir, cleanup_mode=None if keep_running else "stop")
    try:
        yield server.get_uri()
    finally:
        if not keep_running:
            server.cleanup()


def restart_embedded_postgres(pg_dir: Path, timeout_s: float = 60.0) -> None:
    """Restart the embedded postmaster in ``pg_dir`` (``pg_ctl restart -m fast``: every
    session is cut, as in a failover), as the user ``pgserver`` runs it as; returns once it
    accepts connections again, on the same socket."""
    import pgserver
    from pgserver._commands import pg_ctl

    server = pgserver.get_server(Path(pg_dir).absolute(), cleanup_mode=None)
    pg_ctl(
        ["-w", "-m", "fast", "-l", str(server.log), "restart"],
        pgdata=server.pgdata,
        user=server.system_user,
        timeout=timeout_s,
    )


def _forget_dead_handles(pg_dir: Path) -> None:
    """Drop processes that died without detaching from ``pgserver``'s list of users.

    ``pgserver`` stops the postmaster only when the last process on that list leaves; a
    user killed with SIGKILL stays on it forever, and the postmaster would then outlive
    every later ``kvgate up``. The list is edited under ``pgserver``'s own lock.
    """
    import fasteners
    import psutil
    from pgserver.postgres_server import PostgresServer

    handles = pg_dir / ".handle_pids.json"
    with fasteners.InterProcessLock(PostgresServer.lock_path):
        if not handles.exists():
            return
        pids = json.loads(handles.read_text())
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


@contextlib.contextmanager
def database(dsn: str | None, pg_dir: Path) -> Iterator[str]:
    """Yield the DSN to use: ``dsn`` when given, else the embedded server's."""
    if dsn:
        yield dsn
        return
    with embedded_postgres(pg_dir) as uri:
        yield uri


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, **kw: Any
) -> asyncpg.Pool:
    """The one way kvgate opens an asyncpg pool (same codecs and timeouts everywhere)."""
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, command_timeout=30, **kw
    )
    assert pool is not None
    return pool
