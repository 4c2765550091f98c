"""Talking to a worker: open the upstream request, relay its SSE stream, read its usage.

Failures before anything reached the client raise :class:`UpstreamUnavailable`, which the
caller answers by trying another worker. Once bytes have gone out, a failure cannot be
retried (the client already has part of an answer), so the stream is ended cleanly with an
OpenAI-style error event and ``data: [DONE]``: clients stop instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from protocol.openai_errors import error_body

_DONE = b"data: [DONE]\n\n"


class UpstreamUnavailable(Exception):
    """The worker could not be used for this request; nothing was sent to the client."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass
class Outcome:
    """What became of one proxied request (for usage rows and metrics)."""

    status: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    #: The stream's ``[DONE]`` went out: a hang-up after this is not an abort.
    complete: bool = False

    def take_usage(self, usage: Any) -> None:
        """Copy counts from an OpenAI ``usage`` object."""
        if not isinstance(usage, dict):
            return
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = int(details.get("cached_tokens") or 0)


async def fetch(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    """A non-streaming call, body read; retryable failures raise :class:`UpstreamUnavailable`."""
    try:
        response = await client.post(url, content=body, headers=headers)
    except httpx.TransportError as exc:
        raise UpstreamUnavailable("connect", repr(exc)) from exc
    if response.status_code >= 500:
        raise UpstreamUnavailable("status", f"HTTP {response.status_code}")
    return response


async def open_stream(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]
) -> tuple[httpx.Response, AsyncIterator[bytes], bytes]:
    """Start a streaming call and read its first chunk (still retryable until then).

    Returns the response, its byte iterator and the first chunk. A response that is not
    a 200 is returned fully read, with an empty iterator, to be passed through as is.
    """
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise UpstreamUnavailable("connect", repr(exc)) from exc
    try:
        if response.status_code >= 500:
            raise UpstreamUnavailable("status", f"HTTP {response.status_code}")
        if response.status_code != 200:
            await response.aread()
            return response, _empty(), b""
        chunks = response.aiter_raw()
        first = await anext(chunks, b"")
        if not first:
            raise UpstreamUnavailable("midstream", "stream closed before its first byte")
    except httpx.TransportError as exc:
        await response.aclose()
        raise UpstreamUnavailable("midstream", repr(exc)) from exc
    except BaseException:
        await response.aclose()
        raise
    return response, chunks, first


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


async def relay(
    first: bytes, chunks: AsyncIterator[bytes], wants_usage: bool, outcome: Outcome
) -> AsyncIterator[bytes]:
    """The client's SSE stream: events passed through as whole events, usage noted.

    The usage chunk (the one with ``usage`` and no choices) is dropped unless the client
    asked for it. A transport failure ends the stream with an error event and ``[DONE]``.
    """
    pending = b""
    chunk = first
    while True:
        pending += chunk.replace(b"\r\n", b"\n")
        events, _, pending = pending.rpartition(b"\n\n")
        if events:
            out = _filter(events + b"\n\n", wants_usage, outcome)
            outcome.complete = outcome.complete or _DONE in out
            if out:
                if outcome.first_token_at is None:
                    outcome.first_token_at = time.perf_counter()
                yield out
        try:
            chunk = await anext(chunks, b"")
        except httpx.TransportError as exc:
            outcome.status = 502
            yield _error_event(
                f"The worker failed mid-stream ({type(exc).__name__}); retry the request."
            )
            return
        if not chunk:
            break
    if not outcome.complete:
        outcome.status = 502
        yield _error_event("The worker ended the stream early; retry the request.")


def _filter(events: bytes, wants_usage: bool, outcome: Outcome) -> bytes:
    """Note usage in ``events`` and drop the usage-only event unless it was asked for."""
    if b'"usage"' not in events:
        return events
    kept = []
    for event in events.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"usage"' in event:
            try:
                data = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                kept.append(event)
                continue
            if data.get("usage"):
                outcome.take_usage(data["usage"])
                if not data.get("choices") and not wants_usage:
                    continue
        kept.append(event)
    return b"\n\n".join(kept)


def _error_event(message: str) -> bytes:
    body = error_body(502, message, code="upstream_error")
    return b"data: " + orjson.dumps(body) + b"\n\n" + _DONE
