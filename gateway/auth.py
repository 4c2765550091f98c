"""Who is calling: a team's API key, or an anonymous free-tier client identified by IP.

Key lookups are cached for ``ttl_s`` seconds (so a revoke reaches every replica within that
time). While Postgres is unavailable, keys validated before keep working from the cache
however old, and keys never seen get 503 — never 401, which would tell a paying client
their key is wrong, and never the free tier, which would hide a broken key.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import asyncpg

from gateway import accounts, keys
from gateway.accounts import KeyOwner, Plan
from gateway.client_ip import free_tier_key
from gateway.db import HOT_TIMEOUT_S, UNAVAILABLE
from gateway.errors import ApiError

_CACHE_MAX = 100_000


@dataclass(frozen=True)
class Principal:
    """The party a request is billed and limited as."""

    #: Rate-limit subject: ``team:<id>``, or ``ip:<address>`` (an IPv6 client's /64).
    subject: str
    plan: Plan
    team_id: int | None
    key_id: int | None
    #: Folded into KV page keys by the worker: caches never cross this boundary.
    cache_salt: str
    client_ip: str

    @property
    def anonymous(self) -> bool:
        """True for the free trial tier."""
        return self.team_id is None


class Authenticator:
    """Turns an ``Authorization`` header and client address into a :class:`Principal`."""

    def __init__(self, pool: asyncpg.Pool, ttl_s: float, salt_key: bytes = b"") -> None:
        """``salt_key`` keys the free tier's cache salts (the replicas' shared secret)."""
        self._pool = pool
        self._ttl = ttl_s
        self._salt_key = salt_key
        self._keys: dict[bytes, tuple[float, KeyOwner | None]] = {}
        self._free: tuple[float, Plan] | None = None

    async def authenticate(self, authorization: str | None, client_ip: str) -> Principal:
        """The caller; raises :class:`ApiError` 401 for bad keys, 503 when unverifiable.

        No header, or a bearer token that is not a kvgate key (``EMPTY``,
        ``sk-no-key-required``: the placeholders OpenAI clients send to servers that need
        none), is the anonymous free tier. A ``kvg_`` token must be a live key.
        """
        scheme, _, secret = (authorization or "").partition(" ")
        secret = secret.strip()
        if not authorization or (
            scheme.lower() == "bearer" and not secret.startswith(keys.KEY_PREFIX)
        ):
            return await self._anonymous(client_ip)
        if scheme.lower() != "bearer" or not keys.well_formed(secret):
            raise ApiError(
                401,
                "Malformed API key. Send 'Authorization: Bearer kvg_...' with a key from "
                "`kvgate admin keys create`, or any other bearer token (or none) for the "
                "free tier.",
                code="invalid_api_key",
            )
        owner = await self._owner(secret)
        if owner is None:
            raise ApiError(
                401,
                f"Incorrect or revoked API key {keys.visible_prefix(secret)}…; "
                "ask your team admin for an active key.",
                code="invalid_api_key",
            )
        return Principal(
            f"team:{owner.team_id}",
            owner.plan,
            owner.team_id,
            owner.key_id,
            owner.cache_salt,
            client_ip,
        )

    async def _anonymous(self, client_ip: str) -> Principal:
        plan = await self._free_plan()
        client = free_tier_key(client_ip)
        # Keyed, so that knowing an address is not knowing its cache namespace: whoever could
        # send a worker requests with that salt could probe the address's cached prefixes.
        salt = hmac.new(self._salt_key, f"free:{client}".encode(), hashlib.sha256).hexdigest()[:32]
        return Principal(f"ip:{client}", plan, None, None, salt, client_ip)

    async def _owner(self, secret: str) -> KeyOwner | None:
        digest = keys.hash_key(secret)
        now = time.monotonic()
        cached = self._keys.get(digest)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        try:
            owner = await accounts.lookup_key(self._pool, secret, timeout=HOT_TIMEOUT_S)
        except UNAVAILABLE as exc:
            if cached is not None and cached[1] is not None:
                return cached[1]  # validated before: keep serving through the outage
            raise ApiError(
                503,
                "Cannot verify API keys right now (database unavailable); retry shortly.",
                code="auth_unavailable",
                headers={"retry-after": "1"},
            ) from exc
        if len(self._keys) >= _CACHE_MAX:
            self._keys.clear()
        self._keys[digest] = (now, owner)
        return owner

    async def _free_plan(self) -> Plan:
        now = time.monotonic()
        if self._free is not None and now - self._free[0] < self._ttl:
            return self._free[1]
        try:
            plan = await accounts.get_plan(self._pool, "free", timeout=HOT_TIMEOUT_S)
        except UNAVAILABLE as exc:
            if self._free is not None:
                return self._free[1]
            raise ApiError(
                503, "Free tier unavailable right now (database unavailable); retry shortly."
            ) from exc
        self._free = (now, plan)
        return plan
