"""Streaming a generation to a client, and noticing when the client has gone.

A streamed response is a :class:`protocol.streaming.HangupAwareStream`: a disconnect
cancels it and closes the generation, which aborts the engine request. A non-streaming
response, or a stream before its first token, has nothing to send meanwhile, so
:func:`protocol.disconnect.until_disconnect` watches the connection itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from protocol.disconnect import until_disconnect
from protocol.openai_errors import error_body
from protocol.openai_requests import RequestError
from protocol.streaming import DONE, HangupAwareStream, sse

T = TypeVar("T")


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

    return HangupAwareStream(
        guarded(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
    )


async def started(
    request: Request, items: AsyncGenerator[T, None]
) -> AsyncGenerator[T, None] | None:
    """``items`` once its first item is there; None (``items`` closed) if the client left.

    A stream answered before its first token would report every failure up to then in-band,
    under a 200: a refusal, a crash during prefill. Waiting for the first item lets them
    answer with their own status, which a gateway retries on another worker when it is a
    5xx, and makes the stream's first bytes carry a token.
    """
    try:
        first = await until_disconnect(request, lambda: anext(items, _END))
    except BaseException:
        await items.aclose()
        raise
    if first is None:
        await items.aclose()
        return None
    return _prepended(first, items)


#: what :func:`started` reads from a stream that ended before its first item
_END: Any = object()


async def _prepended(first: T, rest: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """``first``, then the items of ``rest`` (closed with this generator)."""
    async with aclosing(rest):
        if first is not _END:
            yield first
        async for item in rest:
            yield item
