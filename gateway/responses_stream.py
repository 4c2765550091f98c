"""The Responses API's server-sent events, made from a worker's chat completion stream.

The sequence is OpenAI's for one text message: ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
one ``response.output_text.delta`` per chunk of text, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and the final state:
``response.completed`` (or ``response.incomplete`` when the length cap cut it, with the
usage either way), or ``response.failed`` when the worker failed mid-stream. Each event is
``event: <type>`` plus ``data: <json>`` with a ``sequence_number``; there is no
``[DONE]``. The response is stored (``finish``) before its final event goes out, so a
client may chain from it as soon as it has that event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from gateway.responses_objects import Draft
from protocol.streaming import DONE

#: the final event for each status of a finished response
FINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


class _Sequence:
    """Numbers the events of one stream."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, kind: str, **payload: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.next, **payload}
        self.next += 1
        return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


async def events(
    chunks: AsyncGenerator[bytes, None],
    draft: Draft,
    finish: Callable[[Draft], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The Responses events for the chat completion stream ``chunks`` (whole SSE events,
    as :func:`gateway.proxy.relay` yields them); ``chunks`` is closed however this ends,
    which is what releases the request's lease and records its usage."""
    seq = _Sequence()
    where = {"item_id": draft.message_id, "output_index": 0, "content_index": 0}
    try:
        yield seq.event("response.created", response=draft.response("in_progress"))
        yield seq.event("response.in_progress", response=draft.response("in_progress"))
        yield seq.event(
            "response.output_item.added", output_index=0, item=draft.message(done=False)
        )
        yield seq.event("response.content_part.added", **where, part=draft.part(""))
        error: dict[str, Any] | None = None
        done = False
        async for piece in chunks:
            for raw in piece.split(b"\n\n"):
                if raw + b"\n\n" == DONE:
                    done = True
                elif raw.startswith(b"data: {"):
                    try:
                        chunk = orjson.loads(raw[6:])
                    except orjson.JSONDecodeError:
                        continue  # not an event this translation can use
                    if isinstance(chunk.get("error"), dict):
                        error = chunk["error"]
                        continue
                    delta = _take(chunk, draft)
                    if delta:
                        yield seq.event(
                            "response.output_text.delta", **where, delta=delta, logprobs=[]
                        )
        if error is not None or not done:
            message = (error or {}).get("message") or "The worker ended the stream early."
            draft.store = False
            failure = {"code": "server_error", "message": message}
            yield seq.event("response.failed", response=draft.response("failed", failure))
            return
        yield seq.event("response.output_text.done", **where, text=draft.text, logprobs=[])
        yield seq.event("response.content_part.done", **where, part=draft.part())
        yield seq.event("response.output_item.done", output_index=0, item=draft.message(done=True))
        await finish(draft)
        final = draft.final()
        yield seq.event(FINAL_EVENTS[final["status"]], response=final)
    finally:
        await chunks.aclose()


def _take(chunk: dict[str, Any], draft: Draft) -> str:
    """Note one chat chunk's finish reason and usage in ``draft``; its text."""
    if isinstance(chunk.get("usage"), dict):
        draft.usage = chunk["usage"]
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            text += delta["content"]
        if choice.get("finish_reason"):
            draft.finish_reason = choice["finish_reason"]
    draft.text += text
    return text
