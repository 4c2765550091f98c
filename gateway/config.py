"""The gateway's own settings: filled by ``kvgate`` from its Settings, or by tests directly."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from gateway.pages.config import AccountsConfig
from gateway.public.config import SiteConfig

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a gateway replica needs to know; every field has a production default."""

    #: Postgres DSN shared by all replicas (accounts, limits, usage, worker registry).
    dsn: str
    #: Proxies whose ``X-Forwarded-For`` is believed; others are the client themselves.
    trusted_proxies: tuple[Network, ...] = ()
    #: Fraction of the healthy workers' capacity that free-tier requests may occupy.
    free_share: float = 0.3
    #: Largest accepted request body, bytes.
    body_limit: int = 1 << 20
    #: Seconds between usage batch writes.
    usage_flush_s: float = 0.5
    #: Usage rows kept in memory while Postgres is away; beyond this the oldest are dropped
    #: (and counted), because an unbounded buffer would take the gateway down instead.
    usage_buffer_max: int = 200_000
    #: Seconds a key lookup is trusted before asking Postgres again.
    auth_cache_ttl_s: float = 2.0
    #: Seconds between reloads of the worker registry.
    registry_refresh_s: float = 1.0
    #: Seconds between readings of how long paid usage has waited for Stripe (a metric).
    billing_watch_s: float = 60.0
    #: Workers whose heartbeat is older than this are left out.
    worker_timeout_s: float = 5.0
    #: Seconds to connect to a worker, and the longest a worker may take for one request.
    connect_timeout_s: float = 2.0
    upstream_timeout_s: float = 600.0
    #: Workers tried per request before giving up (only before the first byte is sent).
    max_attempts: int = 3
    #: No worker gets more than this multiple of the mean in-flight load.
    load_factor: float = 1.25
    #: Consecutive failures that open a worker's circuit, and how long it stays open.
    breaker_failures: int = 3
    breaker_open_s: float = 5.0
    #: Asyncpg pool bounds.
    db_pool_min: int = 2
    db_pool_max: int = 10
    #: Console, sign-in, email and Stripe billing (``gateway.console``, ``gateway.billing``).
    accounts: AccountsConfig = field(default_factory=AccountsConfig)
    #: Public site, contact form and /admin (``gateway.public``, ``gateway.admin``).
    site: SiteConfig = field(default_factory=SiteConfig)

    @staticmethod
    def parse_networks(cidrs: list[str] | tuple[str, ...]) -> tuple[Network, ...]:
        """CIDR strings as networks; a bare address is a /32 (or /128)."""
        return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
