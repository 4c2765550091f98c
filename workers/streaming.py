"""Server-sent events and client-disconnect handling shared by all generating routes.

Streaming responses are cancelled by Starlette when the client disconnects; that
cancellation closes the generation and so aborts the engine request. A non-streaming
response has nothing to send until the end, so :func:`until_disconnect` watches the
connection itself and cancels the work when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from protocol.openai_errors import error_body
from protocol.openai_requests import RequestError

T = TypeVar("T")

#: The last event of every OpenAI-style stream.
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


class _ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator when it ends, however it ends.

    Starlette leaves an iterator it stopped early (client gone) to the garbage collector;
    closing it here aborts the engine request at once and deterministically.
    """

    body_iterator: AsyncGenerator[bytes, None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def sse_response(events: AsyncGenerator[bytes, None], headers: dict[str, str]) -> StreamingResponse:
    """A streaming ``text/event-stream`` response that ends a failure with an error event."""

    async def guarded() -> AsyncGenerator[bytes, None]:
        async with aclosing(events):
            try:
                async for event in events:
                    yield event
            except RequestError as exc:  # refused once the stream had started
                yield sse(error_body(exc.status, exc.message, param=exc.param, code=exc.code))
                yield DONE
            except Exception as exc:
                # Headers are gone already: tell the client in-band, as OpenAI does.
                yield sse(error_body(500, f"generation failed: {exc}"))
                yield DONE

    return _ClosingStreamingResponse(
        guarded(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
    )


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work``; cancel it and return None if the client disconnects first.

    Exceptions of ``work`` propagate unchanged (so a RequestError still becomes a 400).
    """
    job = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not job.done():
            job.cancel()
            # Let the cancelled work close its engine iterator before we return.
            await asyncio.gather(job, return_exceptions=True)
    return None if job.cancelled() else job.result()


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
