"""The gateway's view of the worker registry, reloaded from Postgres every second or so."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from gateway.db import HOT_TIMEOUT_S, UNAVAILABLE
from gateway.router import Router
from protocol import registry

log = logging.getLogger(__name__)


class Directory:
    """Keeps a :class:`Router` fed with the healthy workers from the registry table.

    While Postgres is unavailable the last known list stays in use: workers keep serving,
    and the circuit breaker sidelines any that die meanwhile.
    """

    def __init__(
        self, pool: asyncpg.Pool, router: Router, refresh_s: float, max_age_s: float
    ) -> None:
        self._pool = pool
        self._router = router
        self._refresh_s = refresh_s
        self._max_age_s = max_age_s
        self.loaded = False

    async def refresh(self) -> None:
        """Reload once (raises the database error when Postgres is unavailable)."""
        async with self._pool.acquire(timeout=HOT_TIMEOUT_S) as conn:
            workers = await registry.list_healthy(conn, self._max_age_s)
        self._router.update(workers)
        self.loaded = True

    async def run(self) -> None:
        """Reload forever, every ``refresh_s`` seconds (a periodic timer, not a wait)."""
        while True:
            try:
                await self.refresh()
            except UNAVAILABLE as exc:
                log.warning("worker registry not refreshed (database unavailable): %s", exc)
            await asyncio.sleep(self._refresh_s)
