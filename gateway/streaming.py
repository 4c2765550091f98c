"""A streaming response that notices a client hang-up at once, even while upstream is quiet.

Starlette's own ``StreamingResponse`` (ASGI spec 2.4) learns of a disconnect only when its
next write fails, i.e. after the worker produced another token. Here a disconnect cancels
the stream immediately and closes the body iterator, whose cleanup aborts the upstream
request, so an abandoned generation stops consuming a GPU.
"""

from __future__ import annotations

import contextlib

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


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
