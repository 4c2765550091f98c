"""Server-sent events as both sides of the wire write them, and a stream that notices a hang-up.

Every OpenAI-style stream is ``data: {json}`` events ending with :data:`DONE`; the gateway
relays a worker's events and the workers write their own, so both take the marker and the
encoder from here.

Starlette's own ``StreamingResponse`` (ASGI spec 2.4) learns of a disconnect only when its
next write fails, i.e. after the engine produced another token. :class:`HangupAwareStream`
cancels the stream as soon as the client leaves and closes the body iterator however the
stream ends, so the iterator's cleanup aborts the generation (on a worker) or the upstream
request (on a gateway) at once, rather than when the garbage collector gets to it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

#: The last event of every OpenAI-style stream.
DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    """One ``data:`` event carrying ``payload`` as JSON (``str`` enums, such as tier names,
    allowed as keys)."""
    return b"data: " + orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


class HangupAwareStream(StreamingResponse):
    """``StreamingResponse`` that watches for ``http.disconnect`` while streaming."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                with anyio.CancelScope(shield=True):
                    await closer()
