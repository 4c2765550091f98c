"""Talking to a worker: open the upstream request, relay its SSE stream, read its usage.

Failures before anything reached the client raise :class:`UpstreamUnavailable`, which the
caller answers by trying another worker. Once bytes have gone out, a failure cannot be
retried (the client already has part of an answer), so the stream is ended cleanly with an
OpenAI-style error event and ``data: [DONE]``: clients stop instead of hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from protocol.openai_errors import error_body
from protocol.streaming import DONE, sse
from protocol.tiers import TIERS


class UpstreamUnavailable(Exception):
    """The worker could not be used for this request; nothing was sent to the client."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class UpstreamTimeout(Exception):
    """A worker took a non-streamed request and sent nothing back within the read timeout.

    Not retried: the worker may still be generating, and another would run it all again.
    """


#: What a failing worker connection raises (aiohttp's errors, and read timeouts).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError)


@dataclass
class Outcome:
    """What became of one proxied request (for usage rows and metrics)."""

    status: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    #: cached prompt tokens by the tier they came from, as the worker reports them
    cached_by_tier: dict[str, int] = field(default_factory=dict)
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
            by_tier = details.get("cached_tokens_by_tier")
            if isinstance(by_tier, dict):
                self.cached_by_tier = {
                    tier: count
                    for tier, count in by_tier.items()
                    if tier in TIERS and isinstance(count, int) and count >= 0
                }


@dataclass(frozen=True)
class UsageWanted:
    """What usage the client asked to see in its stream."""

    #: the usage-only chunk at the end (``include_usage``)
    final: bool
    #: the running usage on every chunk too (``continuous_usage_stats``)
    every_chunk: bool


@dataclass
class Reply:
    """A worker's answer read whole (non-streaming, or a stream refused with an error)."""

    status: int
    content_type: str
    body: bytes


@dataclass
class Stream:
    """A worker's open SSE stream: its first chunk and the rest."""

    first: bytes
    chunks: AsyncIterator[bytes]
    _response: aiohttp.ClientResponse

    def close(self, complete: bool) -> None:
        """Free the connection: back to the pool when the stream ended, else cut it (which
        is how the worker learns to abort the generation)."""
        if complete:
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """The HTTP client for workers.

    aiohttp rather than httpx: httpx's connection pool spends time quadratic in its
    connections, and at 64 concurrent requests it managed under 100 requests/s here.
    """

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool (needs the running event loop)."""
        self._session = aiohttp.ClientSession(
            timeout=self._timeout,
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self) -> None:
        """Close every connection."""
        if self._session is not None:
            await self._session.close()

    async def fetch(self, url: str, body: bytes, headers: dict[str, str]) -> Reply:
        """A non-streaming call, body read; retryable failures raise :class:`UpstreamUnavailable`,
        a worker silent past the read timeout :class:`UpstreamTimeout`.

        Cancelled (the client left), it closes the connection, which is how the worker
        learns to abort the generation.
        """
        assert self._session is not None
        try:
            async with self._session.post(url, data=body, headers=headers) as response:
                if response.status >= 500:
                    raise UpstreamUnavailable("status", f"HTTP {response.status}")
                try:
                    content = await response.read()
                except asyncio.CancelledError:
                    response.close()
                    raise
                return Reply(response.status, response.content_type, content)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable("connect", repr(exc)) from exc
        except aiohttp.SocketTimeoutError as exc:
            raise UpstreamTimeout(repr(exc)) from exc
        except TRANSPORT_ERRORS as exc:
            raise UpstreamUnavailable("read", repr(exc)) from exc

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]) -> Stream | Reply:
        """Start a streaming call and read its first chunk (still retryable until then).

        A response that is not a 200 comes back whole, as a :class:`Reply`, to be passed
        through as is.
        """
        assert self._session is not None
        try:
            response = await self._session.post(url, data=body, headers=headers)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable("connect", repr(exc)) from exc
        except TRANSPORT_ERRORS as exc:
            raise UpstreamUnavailable("read", repr(exc)) from exc
        try:
            if response.status >= 500:
                raise UpstreamUnavailable("status", f"HTTP {response.status}")
            if response.status != 200:
                reply = Reply(response.status, response.content_type, await response.read())
                response.release()
                return reply
            chunks = response.content.iter_any()
            first = await anext(chunks, b"")
            if not first:
                raise UpstreamUnavailable("midstream", "stream closed before its first byte")
        except TRANSPORT_ERRORS as exc:
            response.close()
            raise UpstreamUnavailable("midstream", repr(exc)) from exc
        except BaseException:
            response.close()
            raise
        return Stream(first, chunks, response)


async def relay(
    first: bytes, chunks: AsyncIterator[bytes], wanted: UsageWanted, outcome: Outcome
) -> AsyncIterator[bytes]:
    """The client's SSE stream: events passed through as whole events, usage noted.

    The worker was asked for usage on every chunk, so ``outcome`` holds what a stream cut
    short delivered; the client sees only the usage it asked for (``wanted``). An error
    event from the worker marks the outcome failed (502). A transport failure ends the
    stream with an error event and ``[DONE]``.
    """
    pending = b""
    chunk = first
    while True:
        pending += chunk.replace(b"\r\n", b"\n")
        events, _, pending = pending.rpartition(b"\n\n")
        if events:
            out = _filter(events + b"\n\n", wanted, outcome)
            outcome.complete = outcome.complete or DONE in out
            if out:
                if outcome.first_token_at is None:
                    outcome.first_token_at = time.perf_counter()
                yield out
        try:
            chunk = await anext(chunks, b"")
        except TRANSPORT_ERRORS as exc:
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


def _has_usage(event: bytes) -> bool:
    """Whether ``event`` may carry usage numbers (``"usage": null`` needs no JSON parse)."""
    count = event.count(b'"usage"')
    return count > event.count(b'"usage":null') + event.count(b'"usage": null')


def _is_error(event: bytes) -> bool:
    """Whether ``event`` is an in-band error (a JSON string's quotes are escaped, so
    generated text cannot look like this key)."""
    return event.startswith(b'data: {"error"')


def _filter(events: bytes, wanted: UsageWanted, outcome: Outcome) -> bytes:
    """Note usage in ``events`` and give the client only the usage it asked for."""
    if not _has_usage(events) and b'"error"' not in events:
        return events
    kept = []
    for event in events.split(b"\n\n"):
        if _is_error(event):
            outcome.status = 502
        elif event.startswith(b"data: {") and _has_usage(event):
            try:
                data = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                kept.append(event)
                continue
            if data.get("usage"):
                outcome.take_usage(data["usage"])
                if not data.get("choices"):  # the usage-only chunk at the end
                    if not wanted.final:
                        continue
                elif not wanted.every_chunk:  # a token chunk with the running usage
                    if wanted.final:
                        data["usage"] = None
                    else:
                        del data["usage"]
                    event = b"data: " + orjson.dumps(data)
        kept.append(event)
    return b"\n\n".join(kept)


def _error_event(message: str) -> bytes:
    body = error_body(502, message, code="upstream_error")
    return sse(body) + DONE
