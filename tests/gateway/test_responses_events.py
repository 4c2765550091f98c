"""The Responses event stream made from a chat completion stream, checked against the
``openai`` SDK's event types: the bytes in are what a worker sends through the gateway's
relay (whole SSE events), so each final state can be shown, ``completed`` included (the
stub upstream and the tiny random model always stop at their length cap)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.responses_objects import Draft
from gateway.responses_stream import events
from protocol.responses import parse
from protocol.streaming import DONE, sse

EVENTS = TypeAdapter(ResponseStreamEvent)


def _chunk(text: str | None, finish: str | None = None, usage: Any = None) -> bytes:
    choices = (
        [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    )
    return sse({"id": "c", "object": "chat.completion.chunk", "choices": choices, "usage": usage})


USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 2,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 32, "cached_tokens_by_tier": {"device": 32}},
}


async def _run(pieces: list[bytes]) -> tuple[list[dict[str, Any]], list[str]]:
    """The events for ``pieces``, and the order in which the upstream stream closed, the
    response was stored and the final event went out."""
    order: list[str] = []

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            for piece in pieces:
                yield piece
        finally:
            order.append("upstream closed")

    async def finish(draft: Draft) -> None:
        draft.complete()
        order.append(f"finish {draft.status}")

    request = parse({"model": "m", "input": "hi", "metadata": {"k": "v"}, "stream": True})
    draft = Draft("resp_" + "a" * 48, "msg_" + "b" * 48, request, store=True)
    out = []
    async for piece in events(chunks(), draft, finish):
        head, data = piece.decode().rstrip("\n").split("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        EVENTS.validate_python(event)
        out.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            order.append("final event")
    return out, order


async def test_a_stopped_stream_completes_with_usage_after_it_is_stored() -> None:
    out, order = await _run([_chunk("Hel"), _chunk("lo", "stop") + _chunk(None, usage=USAGE), DONE])
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in out] == list(range(10))
    assert out[6]["text"] == "Hello"
    final = out[-1]["response"]
    assert final["status"] == "completed" and final["completed_at"] is not None
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"]["input_tokens"] == 40 and final["usage"]["output_tokens"] == 2
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 32
    assert final["usage"]["input_tokens_details"]["cached_tokens_by_tier"] == {"device": 32}
    assert final["metadata"] == {"k": "v"}
    # The lease goes first (the upstream stream's end releases it), then the response is
    # stored (finish), and only then does the client learn it may chain from it.
    assert order == ["upstream closed", "finish completed", "final event"]


async def test_an_error_from_the_worker_fails_the_response_unstored() -> None:
    error = {"error": {"message": "The worker failed mid-stream.", "code": "upstream_error"}}
    out, order = await _run([_chunk("Hel"), sse(error) + DONE])
    assert [e["type"] for e in out][-2:] == ["response.output_text.delta", "response.failed"]
    final = out[-1]["response"]
    assert final["status"] == "failed" and final["store"] is False
    assert final["error"]["message"] == "The worker failed mid-stream."
    assert order == ["upstream closed", "final event"]  # nothing stored


async def test_a_stream_cut_short_fails_and_an_aborted_one_is_failed_too() -> None:
    out, _ = await _run([_chunk("Hel")])  # no [DONE]
    assert out[-1]["type"] == "response.failed"
    out, order = await _run([_chunk("x", "abort") + _chunk(None, usage=USAGE), DONE])
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["error"]["code"] == "server_error"
    assert order == ["upstream closed", "finish failed", "final event"]
