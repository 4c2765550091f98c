"""Operational endpoints: health, load, metrics, server info, abort, cache flush, cold
storage, and attaching or detaching the tiers below the device pool.

Shapes follow SGLang's server so that one gateway and one dashboard handle both the
built-in worker and SGLang workers. Like every worker route they trust their caller: only
the gateways reach a worker (``infra/k8s/network-policies.yaml``), and a gateway names
the cache namespace (``cache_salt``) of the caller it authenticated, here as on every
completion. ``POST /cold_storage`` is how the playground's "send this conversation to
cold storage" reaches the worker (``gateway/public/playground.py``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Literal

import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from protocol.fields import STORAGE_BACKEND_PATH, TIERS_BACKEND
from protocol.openai_errors import error_body
from protocol.openai_requests import parse_body
from tiering.cold_storage import ColdStorageUnavailable
from tiering.tiers.base import TierError
from workers.context import WorkerContext
from workers.generation import collect


class AbortRequest(BaseModel):
    """Body of ``POST /abort_request``."""

    model_config = ConfigDict(extra="ignore")

    rid: str


class ColdStorageRequest(BaseModel):
    """Body of ``POST /cold_storage``: whose pages, and to which tier."""

    model_config = ConfigDict(extra="forbid")

    #: the cache namespace, as completions carry it (the gateway sets it)
    cache_salt: str = Field(max_length=256)
    tier: Literal["nas", "object"]


class StorageBackendRequest(BaseModel):
    """Body of ``PUT /hicache/storage-backend``, as SGLang takes it (its backend's name).
    The worker's tiers (host RAM, NAS, object store, ledger: whichever it was started with)
    are its only backend, :data:`~protocol.fields.TIERS_BACKEND`."""

    model_config = ConfigDict(extra="forbid")

    hicache_storage_backend: Literal["kvgate"]


def ops_routes(ctx: WorkerContext) -> list[Route]:
    """The routes, bound to ``ctx``."""

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def health_generate(request: Request) -> Response:
        # A real one-token generation: proves the model, the pool and the scheduler work.
        gen = ctx.engine_request(
            f"health-{uuid.uuid4().hex}",
            [0],
            max_tokens=1,
            sampling={"temperature": 0.0, "ignore_eos": True},
            cache_salt="",
            param="input_ids",
        )
        with anyio.move_on_after(ctx.config.health_timeout_s):
            final = await collect(ctx.start(gen, ()))
            if final.usage.completion_tokens >= 1:
                return PlainTextResponse("ok")
        return JSONResponse(
            error_body(503, f"no token generated within {ctx.config.health_timeout_s:g} s"),
            status_code=503,
        )

    async def server_info(request: Request) -> Response:
        load = ctx.engine.load()
        return JSONResponse(
            {
                "model_id": ctx.engine.model_id,
                "context_length": ctx.engine.context_length,
                "eos_token_ids": list(ctx.engine.eos_token_ids),
                "kv_pool_pages": load.pool_total_pages,
                # prompt tokens computed per second of prefill, since start (None until
                # the first prefill): what recomputing a prompt costs here
                "prefill_tokens_per_s": (
                    load.prefill_tokens / load.prefill_seconds if load.prefill_seconds else None
                ),
                **ctx.config.server_info,
            }
        )

    async def loads(request: Request) -> Response:
        load = ctx.engine.load()
        usage = load.pool_used_pages / load.pool_total_pages if load.pool_total_pages else 0.0
        return JSONResponse(
            {
                "timestamp": time.time(),
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": load.running,
                        "num_waiting_reqs": load.queued,
                        "num_used_pages": load.pool_used_pages,
                        "num_total_pages": load.pool_total_pages,
                        "num_cached_pages": load.cached_pages,
                        "token_usage": usage,
                    }
                ],
            }
        )

    async def metrics(request: Request) -> Response:
        # Reading the tier counters waits on the tier thread: keep it off the event loop.
        body = await anyio.to_thread.run_sync(ctx.metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def abort_request(request: Request) -> Response:
        body = parse_body(AbortRequest, await request.body())
        return JSONResponse({"rid": body.rid, "aborted": ctx.engine.abort(body.rid)})

    async def flush_cache(request: Request) -> Response:
        # It waits for the step under way (seconds on a CPU): keep it off the event loop.
        if await anyio.to_thread.run_sync(ctx.engine.flush_cache):
            return PlainTextResponse("Cache flushed.")
        return JSONResponse(
            error_body(400, "requests are running; flush the cache once the worker is idle"),
            status_code=400,
        )

    async def cold_storage(request: Request) -> Response:
        # Writes every page to a disk or S3: off the event loop, and the scheduler keeps
        # stepping meanwhile (it waits only while the pages are listed and freed).
        body = parse_body(ColdStorageRequest, await request.body())
        try:
            sent = await anyio.to_thread.run_sync(ctx.engine.send_down, body.cache_salt, body.tier)
        except ColdStorageUnavailable as exc:
            return JSONResponse(error_body(409, str(exc), param="tier"), status_code=409)
        except (TierError, OSError, TimeoutError) as exc:
            message = f"the {body.tier} tier failed; nothing was dropped: {exc}"
            return JSONResponse(error_body(503, message), status_code=503)
        return JSONResponse(dataclasses.asdict(sent))

    def backend_state() -> dict[str, str | None]:
        return {
            "hicache_storage_backend": TIERS_BACKEND if ctx.engine.tiers_attached else None,
            "configured": TIERS_BACKEND if ctx.engine.has_tiers else None,
        }

    async def storage_backend(request: Request) -> Response:
        # SGLang's runtime attach/detach: GET says what is attached, PUT attaches the tiers
        # the worker was started with, DELETE detaches them; both only while idle.
        if request.method == "GET":
            return JSONResponse(backend_state())
        attach = request.method == "PUT"
        if attach:
            parse_body(StorageBackendRequest, await request.body())
        try:
            # It waits for the step under way: keep it off the event loop.
            done = await anyio.to_thread.run_sync(ctx.engine.attach_tiers, attach)
        except ColdStorageUnavailable as exc:
            return JSONResponse(error_body(409, str(exc)), status_code=409)
        if not done:
            verb = "attach" if attach else "detach"
            message = f"requests are running or queued; {verb} the tiers once the worker is idle"
            return JSONResponse(error_body(400, message), status_code=400)
        return JSONResponse(backend_state())

    return [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/v1/loads", loads, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["POST"]),
        Route("/cold_storage", cold_storage, methods=["POST"]),
        Route(STORAGE_BACKEND_PATH, storage_backend, methods=["GET", "PUT", "DELETE"]),
    ]
