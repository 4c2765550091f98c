"""What counts as "Postgres is unavailable" for the gateway's degraded modes."""

from __future__ import annotations

import asyncpg

#: Errors meaning the database could not answer (down, restarting, unreachable, too slow),
#: as opposed to a bug in a query. Hot paths fall back to cached state on these.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a connection that broke mid-operation
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionDoesNotExistError,
)

#: Seconds a hot-path query may take before the gateway treats Postgres as unavailable.
HOT_TIMEOUT_S = 2.0
