"""The playground's calls besides ``/v1``: the workers' prefill rate, and cold storage.

- ``GET /playground/prefill?model=NAME``: the prefill rate the model's healthy workers
  measured (prompt tokens computed per second of prefill, each worker's ``/server_info``),
  so the page can say what recomputing a turn's cached tokens would have cost. Read at
  most once per ``PREFILL_TTL_S`` per model, whoever asks.
- ``POST /playground/cold-storage`` with ``{"tier": "nas"}`` or ``{"tier": "object"}``:
  "send this conversation to cold storage". The caller's cache namespace is the one its
  completions use, decided here exactly as for ``/v1`` (the anonymous free tier's is keyed
  from its address, a team key's is its team's ``cache_salt``: :mod:`gateway.auth`), so a
  caller can only ever move its own pages. Every healthy worker is asked
  (``POST /cold_storage``, :mod:`workers.ops_routes`) to write that namespace's pages to
  the tier and drop them from its device pool and host RAM; the next turn comes back from
  the tier. Counted per caller (``ip:<address>`` or ``team:<id>``) in a fixed window
  (``SiteConfig.cold_storage_limit`` per ``cold_storage_window_s``), in Postgres so every
  replica sees one count. The body must be JSON sent as such: a cross-site page cannot send
  that without a CORS preflight, which nothing here answers.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import Authenticator, Principal
from gateway.client_ip import client_ip
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.pages import address_limit
from gateway.pages.kit import PageKit
from protocol import registry
from protocol.openai_requests import RequestError, parse_body

#: seconds a model's prefill rate is reused before the workers are asked again
PREFILL_TTL_S = 5.0
#: longest model name looked up
MAX_MODEL_CHARS = 256
#: how long a worker may take to write a namespace's pages (its own bound is 120 s)
SEND_DOWN_TIMEOUT_S = 130.0
#: the rate-limit scope in ``address_hits``
LIMIT_SCOPE = "cold-storage"
#: the counts a worker answers ``POST /cold_storage`` with, summed over workers
_COUNTS = ("pages", "device_pages", "pinned_pages", "host_pages", "nas_pages")


class ColdStorageBody(BaseModel):
    """Body of ``POST /playground/cold-storage``."""

    model_config = ConfigDict(extra="forbid")

    tier: Literal["nas", "object"]


@dataclass(frozen=True)
class _Answer:
    """One worker's answer to ``POST /cold_storage``."""

    status: int
    body: dict[str, Any]


class PlaygroundOps:
    """Handlers of the playground's prefill-rate and cold-storage calls."""

    def __init__(self, site: PageKit, config: GatewayConfig) -> None:
        self.site = site
        self.config = config
        self._auth: Authenticator | None = None
        self._rates: dict[str, tuple[float, dict[str, Any]]] = {}

    def _authenticator(self) -> Authenticator:
        # The pool opens in the gateway's lifespan: build on first use. The salt key is the
        # one the /v1 routes use, so a caller's namespace here is its namespace there.
        if self._auth is None:
            cfg = self.config
            self._auth = Authenticator(
                self.site.db, cfg.auth_cache_ttl_s, cfg.accounts.session_secret.encode()
            )
        return self._auth

    async def _caller(self, request: Request) -> Principal:
        peer = request.client.host if request.client else None
        ip = client_ip(peer, request.headers.get("x-forwarded-for"), self.config.trusted_proxies)
        return await self._authenticator().authenticate(request.headers.get("authorization"), ip)

    # --- the prefill rate ---------------------------------------------------------------------
    async def prefill(self, request: Request) -> Response:
        """The measured prefill rate of the workers serving ``?model=``."""
        try:
            model = request.query_params.get("model", "")
            if not model or len(model) > MAX_MODEL_CHARS:
                raise ApiError(
                    400, f"give ?model= (at most {MAX_MODEL_CHARS} characters)", param="model"
                )
            now = time.monotonic()
            cached = self._rates.get(model)
            if cached is not None and now - cached[0] < PREFILL_TTL_S:
                return JSONResponse(cached[1])
            urls = [w.url for w in await self._healthy() if w.model == model]
            if not urls:
                raise ApiError(404, f"No healthy worker serves model {model!r}.", param="model")
            rates = [r for r in await asyncio.gather(*map(self._rate, urls)) if r]
            payload = {
                "model": model,
                "workers": len(urls),
                # the mean of the workers that measured one; None before any prefilled
                "prefill_tokens_per_s": sum(rates) / len(rates) if rates else None,
            }
        except ApiError as exc:
            return exc.response()
        self._rates[model] = (now, payload)
        return JSONResponse(payload)

    async def _rate(self, url: str) -> float | None:
        try:
            async with httpx.AsyncClient(timeout=self.config.site.metrics_timeout_s) as client:
                reply = await client.get(url + "/server_info")
            rate = reply.json().get("prefill_tokens_per_s") if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None  # not a built-in worker, or gone: no figure from it
        return float(rate) if isinstance(rate, int | float) and rate > 0 else None

    async def _healthy(self) -> list[registry.WorkerInfo]:
        return await registry.list_healthy(self.site.db, self.config.worker_timeout_s)

    # --- cold storage ---------------------------------------------------------------------------
    async def cold_storage(self, request: Request) -> Response:
        """Send the caller's own cached conversations to the tier its body names."""
        try:
            return await self._cold_storage(request)
        except ApiError as exc:
            return exc.response()

    async def _cold_storage(self, request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ApiError(415, "Send the body as JSON (content-type: application/json).")
        try:
            body = parse_body(ColdStorageBody, await request.body())
        except RequestError as exc:
            raise ApiError(exc.status, exc.message, param=exc.param, code=exc.code) from None
        who = await self._caller(request)
        site = self.config.site
        wait = await address_limit.hit(
            self.site.db, LIMIT_SCOPE, who.subject, site.cold_storage_limit,
            site.cold_storage_window_s,
        )  # fmt: skip
        if wait:
            raise ApiError(
                429,
                f"At most {site.cold_storage_limit} moves to cold storage per "
                f"{site.cold_storage_window_s:g} s; try again in {math.ceil(wait)} s.",
                code="rate_limit_exceeded",
                headers={"retry-after": str(math.ceil(wait))},
            )
        workers = await self._healthy()
        if not workers:
            raise ApiError(503, "No worker is serving right now; try again in a minute.")
        payload = {"cache_salt": who.cache_salt, "tier": body.tier}
        async with httpx.AsyncClient(timeout=SEND_DOWN_TIMEOUT_S) as client:
            answers = await asyncio.gather(*(self._send(client, w.url, payload) for w in workers))
        return _summary(body.tier, answers)

    async def _send(self, client: httpx.AsyncClient, url: str, payload: dict[str, str]) -> _Answer:
        try:
            reply = await client.post(url + "/cold_storage", json=payload)
            data = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            return _Answer(502, {"error": {"message": f"worker unreachable: {exc}"}})
        return _Answer(reply.status_code, data if isinstance(data, dict) else {})


def _summary(tier: str, answers: list[_Answer]) -> Response:
    """One answer for the caller: the counts summed over the workers that moved pages, or
    why none did (409: the tier is not configured there; 502: they failed)."""
    done = [a.body for a in answers if a.status == 200]
    if done:
        counts = {k: sum(int(b.get(k, 0)) for b in done) for k in _COUNTS}
        return JSONResponse({"tier": tier, "workers": len(done), **counts})
    refused = [a for a in answers if a.status == 409]
    first = (refused or answers)[0].body.get("error", {})
    message = first.get("message", "no answer") if isinstance(first, dict) else "no answer"
    if refused:
        raise ApiError(409, f"Cannot move pages to {tier}: {message}", param="tier")
    raise ApiError(502, f"No worker could move the pages to {tier}: {message}")
