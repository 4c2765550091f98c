"""``kvgate gateway``: run one gateway replica (any number may share a Postgres)."""

from __future__ import annotations

import asyncio

import click
import uvicorn

from gateway.app import build_app
from gateway.config import GatewayConfig
from gateway.http_limits import LimitedHttpToolsProtocol
from kvgate.settings import Settings, load_settings
from kvgate.wiring.accounts import accounts_config
from kvgate.wiring.database import migrate_database, settings_database
from kvgate.wiring.public import one_secret_per_process, site_config


def gateway_config(settings: Settings, dsn: str) -> GatewayConfig:
    """The gateway's config from the kvgate settings."""
    return GatewayConfig(
        dsn=dsn,
        trusted_proxies=GatewayConfig.parse_networks(settings.gateway_trusted_proxies),
        free_share=settings.gateway_free_share,
        body_limit=settings.gateway_body_limit,
        usage_flush_s=settings.gateway_usage_flush_s,
        auth_cache_ttl_s=settings.gateway_auth_cache_ttl_s,
        worker_timeout_s=settings.gateway_worker_timeout_s,
        upstream_timeout_s=settings.gateway_upstream_timeout_s,
        db_pool_min=min(settings.db_pool_min, settings.db_pool_max),
        db_pool_max=settings.db_pool_max,
        accounts=one_secret_per_process(accounts_config(settings)),
        site=site_config(settings),
    )


@click.command()
@click.option("--host", default=None, help="Address to bind (default: settings bind_host).")
@click.option("--port", type=int, default=None, help="Port (default: settings gateway_port).")
def gateway(host: str | None, port: int | None) -> None:
    """Serve the OpenAI-compatible gateway (keys, limits, routing, usage)."""
    settings = load_settings()
    with settings_database(settings) as dsn:
        asyncio.run(migrate_database(dsn))
        app = build_app(gateway_config(settings, dsn))
        uvicorn.run(
            app,
            host=host or settings.bind_host,
            port=port or settings.gateway_port,
            loop="uvloop",
            # httptools with limits on header size and count, and on how long a request's
            # head and body may take to arrive (a public endpoint meets slow clients)
            http=LimitedHttpToolsProtocol,
            log_level="warning",
            # X-Forwarded-For is judged by the gateway against its own trusted proxies;
            # uvicorn's default would believe any loopback peer.
            proxy_headers=False,
            timeout_graceful_shutdown=15,
        )
