"""Pure-ASGI middleware: a request id on every response, and the body size limit.

Pure ASGI rather than ``BaseHTTPMiddleware`` because it adds microseconds, not
milliseconds, and does not buffer streamed responses.
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ApiError
from protocol.fields import REQUEST_ID_HEADER

_HEADER = REQUEST_ID_HEADER.encode()


class RequestIdMiddleware:
    """Gives each request a fresh id (``scope["state"]["request_id"]``) and echoes it.

    The id is always minted here, never taken from the client: it keys the usage row,
    which must be unique.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        raw = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (_HEADER, raw)]
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """Refuses bodies over ``limit`` bytes with 413: early by ``Content-Length``, else
    while reading, so a chunked upload cannot get past the limit either."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(scope, receive, send)
                return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ApiError(
            413,
            f"Request body is larger than {self.limit} bytes; send a shorter prompt.",
            code="request_too_large",
        )
        await error.response()(scope, receive, send)


class _TooLarge(Exception):
    pass
