"""The built-in worker's HTTP app: OpenAI-compatible and SGLang-native endpoints over an engine.

``create_app`` is the only entry point; everything the app uses is passed in (no globals),
so tests build an app around a real engine and ``kvgate worker`` serves the same app.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.openai_errors import error_body
from protocol.openai_requests import RequestError
from workers.context import ChatTemplate, ServerConfig, TextTokenizer, WorkerContext
from workers.engine.api import Engine
from workers.metrics import ServerMetrics
from workers.native_routes import native_routes
from workers.openai_routes import openai_routes
from workers.ops_routes import ops_routes


def create_app(
    engine: Engine,
    tokenizer: TextTokenizer,
    chat_template: ChatTemplate,
    config: ServerConfig | None = None,
) -> Starlette:
    """An ASGI app serving ``engine``; its metrics registry is its own."""
    config = config or ServerConfig()
    ctx = WorkerContext(
        engine=engine,
        tokenizer=tokenizer,
        chat_template=chat_template,
        config=config,
        metrics=ServerMetrics(engine, config.tier_stats),
    )
    return Starlette(
        routes=[*openai_routes(ctx), *native_routes(ctx), *ops_routes(ctx)],
        exception_handlers={
            RequestError: _request_error,
            HTTPException: _http_error,
            Exception: _server_error,
        },
    )


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    body = error_body(exc.status, exc.message, param=exc.param, code=exc.code)
    return JSONResponse(body, exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(error_body(exc.status_code, message), exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises the exception after this response, so the server logs it.
    return JSONResponse(error_body(500, f"internal error: {exc}"), 500)
