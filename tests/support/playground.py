"""The playground's stack in one process: a real gateway (``build_app``, served by uvicorn)
and a registered built-in worker on the tiny random model with host RAM, the NAS and the
ledger below its device pool (:func:`tests.support.worker.tiered_tiny_engine`).

Both listen on loopback ports, so a browser (or httpx) talks to the gateway as a visitor
would, and the gateway to the worker over HTTP as in production. Loopback is a trusted
proxy: a test picks its client address with ``X-Forwarded-For``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg

from gateway.app import build_app
from gateway.config import GatewayConfig
from gateway.public.config import SiteConfig
from tests.support.accounts import accounts_config
from tests.support.gateway import deregister, register_workers, unique
from tests.support.worker import MODEL, serving, tiered_tiny_engine, worker_app


@contextlib.asynccontextmanager
async def playground_stack(
    pg_dsn: str, pool: asyncpg.Pool, nas_dir: Path, gguf: Path, **site: Any
) -> AsyncIterator[str]:
    """Serve the stack until the block ends; yields the gateway's base URL. ``site``
    overrides :class:`SiteConfig` fields (the cold-storage limits, say)."""
    with tiered_tiny_engine(nas_dir, dsn=pg_dsn) as engine:
        async with serving(worker_app(engine, gguf)) as worker_url:
            worker_id = unique("w-playground")
            await register_workers(pool, MODEL, {worker_id: worker_url})
            config = GatewayConfig(
                dsn=pg_dsn,
                trusted_proxies=GatewayConfig.parse_networks(["127.0.0.1/32"]),
                # registered once, never heartbeating: healthy for the test's length
                worker_timeout_s=3600,
                db_pool_min=1,
                db_pool_max=4,
                accounts=accounts_config(),
                site=replace(SiteConfig(), **site),
            )
            try:
                async with serving(build_app(config)) as url:
                    yield url
            finally:
                await deregister(pool, [worker_id])
