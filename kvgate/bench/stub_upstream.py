"""A stand-in OpenAI upstream for gateway tests and ``kvgate bench gateway``: not a model.

It answers chat and text completions (streaming or not) with fixed tokens and honest
OpenAI shapes, so the gateway can be exercised without a GPU or weights. Its controls
serve tests: ``/control/stats`` (served and in-flight counts), ``/control/requests`` (the
bodies it received), ``/control/release`` (lets held requests go, with ``hold``; a held
request whose caller leaves ends at once), and
``hang_after`` (stop mid-stream after N chunks and wait to be killed).

Run as ``python -m kvgate.bench.stub_upstream --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from protocol.disconnect import until_disconnect
from protocol.streaming import HangupAwareStream


@dataclass(frozen=True)
class StubConfig:
    """How the stub behaves."""

    worker_id: str = "stub"
    #: Hold every completion until ``POST /control/release``.
    hold: bool = False
    #: Stop streaming after this many chunks and never finish (0 = never stop).
    hang_after: int = 0
    #: Keep the last this many request bodies for ``/control/requests``.
    keep_bodies: int = 200


class _Stub:
    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.served = 0
        self.inflight = 0
        #: Streams still open (a client that hangs up closes its stream at once).
        self.streaming = 0
        self.bodies: deque[dict[str, Any]] = deque(maxlen=config.keep_bodies)
        self.release = asyncio.Event()

    async def complete(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.bodies.append(body)
        self.inflight += 1
        try:
            if self.config.hold and await until_disconnect(request, self._released) is None:
                return Response(status_code=499)  # the caller left while held
            chat = request.url.path.endswith("chat/completions")
            n = max(1, min(int(body.get("max_tokens") or 4), 64))
            prompt_tokens = len(orjson.dumps(body.get("messages") or body.get("prompt"))) // 4
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            if body.get("stream"):
                options = body.get("stream_options") or {}
                include = bool(options.get("include_usage"))
                every = include and bool(options.get("continuous_usage_stats"))
                return HangupAwareStream(
                    self._events(body["model"], chat, n, usage if include else None, every),
                    media_type="text/event-stream",
                )
            return Response(
                orjson.dumps(_whole(body["model"], chat, n, usage, self.config.worker_id)),
                media_type="application/json",
            )
        finally:
            self.inflight -= 1
            self.served += 1

    async def _events(
        self, model: str, chat: bool, n: int, usage: dict[str, Any] | None, every: bool
    ) -> AsyncIterator[bytes]:
        """One ``x`` per token; with ``every``, each chunk carries the usage so far."""
        self.streaming += 1
        try:
            for i in range(n):
                if self.config.hang_after and i >= self.config.hang_after:
                    await asyncio.Event().wait()  # hang until killed or the client leaves
                chunk = _chunk(model, chat, "x", None if i < n - 1 else "length", usage)
                if every and usage is not None:
                    so_far = usage["prompt_tokens"] + i + 1
                    chunk["usage"] = usage | {"completion_tokens": i + 1, "total_tokens": so_far}
                yield _event(chunk)
            if usage is not None:
                yield _event(_chunk(model, chat, None, None, usage))
            yield b"data: [DONE]\n\n"
        finally:
            self.streaming -= 1

    async def _released(self) -> bool:
        await self.release.wait()
        return True

    async def stats(self, request: Request) -> Response:
        return Response(
            orjson.dumps(
                {"served": self.served, "inflight": self.inflight, "streaming": self.streaming}
            ),
            media_type="application/json",
        )

    async def requests(self, request: Request) -> Response:
        return Response(orjson.dumps(list(self.bodies)), media_type="application/json")

    async def do_release(self, request: Request) -> Response:
        self.release.set()
        self.release = asyncio.Event()
        return Response(b"{}", media_type="application/json")


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _chunk(
    model: str, chat: bool, text: str | None, finish: str | None, usage: dict[str, Any] | None
) -> dict[str, Any]:
    if text is None:  # the usage-only chunk at the end
        choices: list[dict[str, Any]] = []
    elif chat:
        choices = [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text, "finish_reason": finish}]
    return {
        "id": "cmpl-stub",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage if text is None else None,
    }


def _whole(model: str, chat: bool, n: int, usage: dict[str, Any], worker: str) -> dict[str, Any]:
    text = "x" * n
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
    return {
        "id": f"cmpl-stub-{worker}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def build_stub_app(config: StubConfig) -> Starlette:
    """The stub upstream as an ASGI app."""
    stub = _Stub(config)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", stub.complete, methods=["POST"]),
            Route("/v1/completions", stub.complete, methods=["POST"]),
            Route("/control/stats", stub.stats, methods=["GET"]),
            Route("/control/requests", stub.requests, methods=["GET"]),
            Route("/control/release", stub.do_release, methods=["POST"]),
            Route("/health", stub.stats, methods=["GET"]),
        ]
    )


def main() -> None:
    """Command-line entry: serve the stub on ``--port``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-id", default="stub")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--hang-after", type=int, default=0)
    args = parser.parse_args()
    config = StubConfig(args.worker_id, args.hold, args.hang_after)
    uvicorn.run(build_stub_app(config), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
