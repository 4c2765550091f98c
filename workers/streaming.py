"""Server-sent events and client-disconnect handling shared by all generating routes.

Streaming responses are cancelled by Starlette when the client disconnects; that
cancellation closes the generation and so aborts the engine request. A non-streaming
response has nothing to send until the end, so :func:`until_disconnect` watches the
connection itself and cancels the work when the client goes away.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse

from protocol.openai_errors import error_body

T = TypeVar("T")

#: The last event of every OpenAI-style stream.
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def sse_response(events: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
    """A streaming ``text/event-stream`` response that ends an engine failure with an error event."""

    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield event
        except Exception as exc:
            # Headers are gone already: tell the client in-band, as OpenAI does.
            yield sse(error_body(500, f"generation failed: {exc}"))
            yield DONE

    return StreamingResponse(
        guarded(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
    )


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work``; cancel it and return None if the client disconnects first."""
    result: T | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(watch)
        result = await work()
        group.cancel_scope.cancel()
    return result
