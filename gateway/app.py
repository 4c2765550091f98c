"""The gateway application: endpoints, the request pipeline, and how the parts are wired.

A completion request goes: authenticate → validate → admit (limits) → route → proxy →
record usage. Everything a replica holds (key cache, worker list, in-flight counts, usage
buffer, metrics) lives on one :class:`Gateway` object made by :func:`build_app`; there is
no module-level state, so tests and benchmarks can run several replicas in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway import inbound, proxy
from gateway.admin.routes import admin_routes
from gateway.admission import DEGRADED, rate_headers, refusal_message
from gateway.auth import Authenticator, Principal
from gateway.billing.meters import unreported_seconds
from gateway.breaker import Breaker
from gateway.call import PATHS, Call
from gateway.client_ip import client_ip
from gateway.config import GatewayConfig
from gateway.console.routes import console_routes
from gateway.db import HOT_TIMEOUT_S, UNAVAILABLE
from gateway.directory import Directory
from gateway.errors import ApiError
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics, ReplicaState
from gateway.middleware import BodyLimitMiddleware, RequestIdMiddleware
from gateway.openapi import document
from gateway.pages.headers import SECURITY_HEADERS, SecurityHeadersMiddleware
from gateway.pages.kit import PageKit
from gateway.pages.mailer import Mailer
from gateway.public.routes import public_routes
from gateway.responses_api import ResponsesApi
from gateway.router import Router
from gateway.usage import UsageRecorder

log = logging.getLogger(__name__)

#: what a client is told of a bug in the gateway
INTERNAL_ERROR = "Internal error in the gateway; retry, and report it if it persists."


class Gateway:
    """One replica's parts and its request handlers."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.metrics.watch(
            ReplicaState(
                usage_pending=lambda: self.usage.pending if self._started else 0,
                usage_dropped=lambda: self.usage.dropped if self._started else 0,
                healthy_workers=lambda: len(self.router.workers()),
            )
        )
        self._started = False
        self.router = Router(config.load_factor)
        self.breaker = Breaker(config.breaker_failures, config.breaker_open_s)
        # Set in startup(): they need the running event loop.
        self.pool: asyncpg.Pool
        self.auth: Authenticator
        self.limiter: Limiter
        self.directory: Directory
        self.usage: UsageRecorder
        self.upstream = proxy.Upstream(config.connect_timeout_s, config.upstream_timeout_s)
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the pool and the upstream client, run the background loops, flush at exit."""
        cfg = self.config
        self.pool = await asyncpg.create_pool(
            cfg.dsn, min_size=cfg.db_pool_min, max_size=cfg.db_pool_max, command_timeout=30
        )
        self.auth = Authenticator(
            self.pool, cfg.auth_cache_ttl_s, cfg.accounts.session_secret.encode()
        )
        self.limiter = Limiter(self.pool, cfg.upstream_timeout_s + 60)
        self.directory = Directory(
            self.pool, self.router, cfg.registry_refresh_s, cfg.worker_timeout_s
        )
        self.usage = UsageRecorder(self.pool, cfg.usage_flush_s, cfg.usage_buffer_max)
        await self.upstream.start()
        await self.directory.refresh()
        self._started = True
        self._tasks = [
            asyncio.create_task(self.directory.run()),
            asyncio.create_task(self.usage.run()),
            asyncio.create_task(self.limiter.run()),
            asyncio.create_task(self._watch_billing()),
        ]
        try:
            yield
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.usage.close(deadline_s=10)
            await self.limiter.flush_releases()
            await self.upstream.close()
            await self.pool.close()

    # --- plain endpoints --------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        """The process is alive."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready when Postgres answers; reports the healthy workers too."""
        try:
            await self.pool.fetchval("SELECT 1", timeout=HOT_TIMEOUT_S)
        except UNAVAILABLE as exc:  # the cause is for the logs, not for the public
            log.warning("readyz: database unavailable: %r", exc)
            return JSONResponse({"status": "database unavailable"}, 503)
        return JSONResponse({"status": "ready", "workers": len(self.router.workers())})

    async def metrics_endpoint(self, request: Request) -> Response:
        """Prometheus text format."""
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def _watch_billing(self) -> None:
        """Keep ``kvgate_billing_unreported_seconds`` current (every replica reads the same
        database, so any of them may answer; Postgres being down just skips a reading)."""
        while True:
            with contextlib.suppress(*UNAVAILABLE, asyncpg.PostgresError):
                self.metrics.billing_unreported.set(await unreported_seconds(self.pool))
            await asyncio.sleep(self.config.billing_watch_s)

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document."""
        return JSONResponse(document())

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: models of healthy workers, as an OpenAI model list."""
        await self.caller(request)
        return JSONResponse({"object": "list", "data": [_model(m) for m in self.router.models()]})

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``: one model, or OpenAI's 404."""
        await self.caller(request)
        name = request.path_params["model"]
        if name not in self.router.models():
            raise ApiError(
                404,
                f"No healthy worker serves model {name!r}; GET /v1/models lists them.",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(_model(name))

    async def caller(self, request: Request) -> Principal:
        """Who is asking (a kvgate key that is not live is refused on every /v1 route)."""
        peer = request.client.host if request.client else None
        ip = client_ip(peer, request.headers.get("x-forwarded-for"), self.config.trusted_proxies)
        return await self.auth.authenticate(request.headers.get("authorization"), ip)

    # --- completions ------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        async def prepare(who: Principal) -> inbound.Inbound:
            return inbound.parse(await request.body(), chat=chat, plan=who.plan)

        return await self.serve(request, PATHS[chat], prepare)

    async def serve(
        self,
        request: Request,
        endpoint: str,
        prepare: Callable[[Principal], Awaitable[inbound.Inbound]],
        respond: Callable[[Call, Response], Awaitable[Response]] | None = None,
    ) -> Response:
        """The pipeline for one completion: authenticate, ``prepare`` the chat or text
        completion the caller asks for (raising :class:`ApiError` to refuse it), admit,
        route, proxy, and pass the worker's answer through ``respond`` (the Responses API
        translates it there). Whatever fails after admission, its lease is released and
        its usage recorded."""
        started = time.perf_counter()
        peer = request.client.host if request.client else None
        ip = client_ip(peer, request.headers.get("x-forwarded-for"), self.config.trusted_proxies)
        try:
            who = await self.auth.authenticate(request.headers.get("authorization"), ip)
        except ApiError as exc:
            self.metrics.requests.labels(endpoint, str(exc.status), "none").inc()
            return exc.response()
        headers = rate_headers(who.plan, None)
        try:
            req = await prepare(who)
            if req.model not in self.router.models():
                raise ApiError(
                    404,
                    f"No healthy worker serves model {req.model!r}; GET /v1/models lists "
                    "the models available now.",
                    param="model",
                    code="model_not_found",
                )
        except ApiError as exc:
            exc.headers.update(headers)
            self.metrics.requests.labels(endpoint, str(exc.status), who.plan.name).inc()
            return exc.response()

        decision = await self.limiter.admit(who, req.cost, self._free_slots())
        headers = rate_headers(who.plan, decision)
        if decision.reason == DEGRADED:
            self.metrics.degraded.labels("limits").inc()
        call = Call(
            self, who, req, decision, request.scope["state"]["request_id"], started, endpoint
        )
        if not decision.allowed:
            assert decision.reason is not None
            self.metrics.rate_limited.labels(decision.reason, who.plan.name).inc()
            return call.finish_error(
                ApiError(
                    429,
                    refusal_message(decision, who.plan, anonymous=who.anonymous),
                    code=decision.reason,
                    headers=headers,
                )
            )
        try:
            response = await call.forward(request, headers)
            return response if respond is None else await respond(call, response)
        except Exception:  # a bug after admission: its lease and usage row are not lost
            log.exception("request %s failed after admission", call.request_id)
            return call.finish_error(ApiError(500, INTERNAL_ERROR, headers=headers))

    def _free_slots(self) -> int:
        capacity = sum(w.capacity for w in self.router.workers())
        return math.floor(self.config.free_share * capacity)


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvgate"}


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    """An unknown route or a wrong method: OpenAI's error shape under /v1 (what clients
    parse there), the plain answer on the pages."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if path.startswith("/v1/") or path == "/v1":
        messages = {
            404: f"No route {path}; see /openapi.json.",
            405: f"{request.method} is not allowed on {path}.",
        }
        message = messages.get(exc.status_code, str(exc.detail))
        return ApiError(exc.status_code, message, headers=dict(exc.headers or {})).response()
    return PlainTextResponse(str(exc.detail), exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug, answered in the OpenAI error shape (uvicorn still logs the traceback).

    Starlette answers it outside every middleware, so the security headers are set here."""
    response = ApiError(500, INTERNAL_ERROR).response()
    response.headers.update(SECURITY_HEADERS)
    return response


async def _bad_value(request: Request, exc: Exception) -> Response:
    """A value Postgres refuses as data (a NUL byte in text, a number beyond 64 bits): it
    came from the client, whichever form, query or path carried it, so it is a 400."""
    message = (
        "A value in this request cannot be stored (a NUL character, or a number out of range)."
    )
    if request.url.path.startswith("/v1/"):
        return ApiError(400, message).response()
    return PlainTextResponse(message, 400)


def build_app(config: GatewayConfig) -> Starlette:
    """The gateway ASGI app for ``config``."""
    gw = Gateway(config)
    # One page machinery (templates, CSRF, sessions, mail) for the console, site and admin.
    site = PageKit(
        config.accounts, lambda: gw.pool, Mailer(config.accounts.smtp), config.trusted_proxies
    )
    responses = ResponsesApi(gw)
    routes = [
        Route("/v1/chat/completions", gw.chat_completions, methods=["POST"]),
        Route("/v1/completions", gw.completions, methods=["POST"]),
        Route("/v1/models", gw.models, methods=["GET"]),
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
        Route("/v1/models/{model:path}", gw.model, methods=["GET"]),
        Route("/healthz", gw.healthz, methods=["GET"]),
        Route("/readyz", gw.readyz, methods=["GET"]),
        Route("/metrics", gw.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", gw.openapi, methods=["GET"]),
        # Sign-in, the team console and Stripe billing: gateway/console/routes.py.
        *console_routes(site),
        # The public site and contact sales: gateway/public/routes.py.
        *public_routes(config, site),
        # The staff dashboard: gateway/admin/routes.py.
        *admin_routes(site, config.site, config.worker_timeout_s),
    ]
    middleware = [
        # CSP, frame, referrer and sniffing headers on every response, 413s included.
        Middleware(SecurityHeadersMiddleware),
        Middleware(RequestIdMiddleware),
        Middleware(BodyLimitMiddleware, limit=config.body_limit),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=gw.lifespan,
        exception_handlers={
            Exception: _internal_error,
            asyncpg.DataError: _bad_value,
            ApiError: _api_error,
            HTTPException: _http_error,
        },
    )
    # A redirect from /path/ to /path would be built from the client's Host header.
    app.router.redirect_slashes = False
    app.state.gateway = gw
    return app
