"""Cancelling work whose HTTP client has gone away (gateway and workers alike).

A streaming response notices a disconnect when it next writes; a request that answers only
at the end (a non-streamed completion, a stream before its first token) has nothing to
write meanwhile, so :func:`until_disconnect` watches the connection itself and cancels the
work when the client leaves: a worker stops generating, a gateway stops waiting on its
worker (which closes that connection, and so aborts the generation there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work``; cancel it and return None if the client disconnects first.

    Exceptions of ``work`` propagate unchanged. The request's body must have been read.
    """
    job = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not job.done():
            job.cancel()
            # Let the cancelled work close what it holds (an engine iterator, a connection).
            await asyncio.gather(job, return_exceptions=True)
    return None if job.cancelled() else job.result()


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
