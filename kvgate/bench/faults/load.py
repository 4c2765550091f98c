"""Steady multi-turn load for ``kvgate bench faults``, and what each request came to.

``clients`` closed-loop clients play a fixed set of seeded conversations, over and over,
with greedy decoding, through two gateway replicas; ``headers_for`` picks each turn's
session key (the command has consecutive turns land on different workers), and every
play of a conversation gets keys of its own. In front of the replicas the clients
do what a load balancer does: each request goes to the next replica, and one that refuses
the connection is skipped (nothing reached it, so nothing is lost by trying another). A
request that fails is retried a second later, as a user would; the history a turn sends
is always the reference run's (the first, fault-free play), so every turn asks exactly
what it asked then and its answer must be the same tokens.

Each request is recorded with the phase that was current when it started and how it
ended: ``ok``, ``clean`` (an HTTP error or an error event, then the end of the stream),
``cut`` (the connection dropped or the stream stopped without ``[DONE]``), ``refused``
(no replica took the connection) or ``hang`` (no end within the client's timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from kvgate.bench.multiturn.driver import chat_body
from kvgate.bench.multiturn.workload import Conversation
from protocol.fields import REQUEST_ID_HEADER

#: seconds a failed turn waits before it is tried again
RETRY_PAUSE_S = 1.0


@dataclass
class Request:
    """One request as the client saw it (times are ``time.monotonic()``)."""

    phase: str
    cid: str
    turn: int
    start: float
    gateway: str = ""
    end: float = 0.0
    outcome: str = ""
    error: str = ""
    request_id: str = ""
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: cached prompt tokens by the tier they came back from, as the worker reported
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    #: replicas that refused the connection before one took it
    skipped_replicas: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class Load:
    """The clients; runs on an event loop of its own thread while faults are injected."""

    def __init__(
        self,
        gateways: list[str],
        api_key: str,
        model: str,
        convs: list[Conversation],
        *,
        clients: int,
        hang_s: float,
        headers_for: Callable[[str, int], dict[str, str]],
    ) -> None:
        self.gateways = gateways
        self.api_key = api_key
        self.model = model
        self.convs = convs
        self.clients = clients
        self.hang_s = hang_s
        self.headers_for = headers_for
        self.phase = "reference"
        self.requests: list[Request] = []
        #: (conversation, turn) -> the answer of the fault-free reference play
        self.reference: dict[tuple[str, int], str] = {}
        self._stop = threading.Event()
        self._next_gateway = itertools.count()
        #: conversation -> how many times it has been started
        self._plays: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    def play_reference(self) -> None:
        """Play every conversation once, fault-free; its answers are the reference."""
        asyncio.run(self._play(iter(self.convs)))
        failed = [r for r in self.requests if not r.ok]
        if failed:
            raise RuntimeError(f"the fault-free reference play failed: {failed[0].error}")

    def start(self) -> None:
        """Start the steady load (the conversations cycled) in a thread."""
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._play(itertools.cycle(self.convs))), daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Let every client finish its request, then end the load."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def since(self, t: float) -> list[Request]:
        """Requests started at or after ``t`` (monotonic), finished or not."""
        return [r for r in list(self.requests) if r.start >= t]

    async def _play(self, order: itertools.cycle | object) -> None:
        lock = asyncio.Lock()
        limits = httpx.Limits(max_connections=self.clients * 2)
        timeout = httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

            async def next_conversation() -> Conversation | None:
                async with lock:
                    return next(order, None)  # type: ignore[call-overload]

            async def client_loop() -> None:
                while not self._stop.is_set() and (conv := await next_conversation()):
                    await self._conversation(client, conv)

            await asyncio.gather(*(client_loop() for _ in range(self.clients)))

    async def _conversation(self, client: httpx.AsyncClient, conv: Conversation) -> None:
        # Each play of a conversation has session keys of its own: the gateways keep a
        # session where it went, and a worker back from a restart would otherwise get
        # none of the conversations that moved away from it.
        play = self._plays[conv.cid] = self._plays.get(conv.cid, -1) + 1
        messages = [{"role": "system", "content": conv.system}]
        for t, turn in enumerate(conv.turns):
            messages = [*messages, {"role": "user", "content": turn.user}]
            while True:
                if self._stop.is_set():
                    return
                req = Request(self.phase, conv.cid, t, time.monotonic())
                self.requests.append(req)
                await self._send(client, req, messages, turn.answer_tokens, f"{conv.cid}-p{play}")
                if req.ok:
                    break
                await asyncio.sleep(RETRY_PAUSE_S)  # a user trying again
            answer = self.reference.setdefault((conv.cid, t), req.text)
            messages = [*messages, {"role": "assistant", "content": answer}]

    async def _send(
        self,
        client: httpx.AsyncClient,
        req: Request,
        messages: list[dict],
        tokens: int,
        session: str,
    ) -> None:
        body = chat_body(self.model, messages, tokens, 0.0)
        auth = {"authorization": f"Bearer {self.api_key}"}
        headers = auth | self.headers_for(session, req.turn)
        try:
            async with asyncio.timeout(self.hang_s):
                await self._balanced(client, req, body, headers)
        except TimeoutError:
            req.outcome, req.error = "hang", f"no end within {self.hang_s:g} s"
        except httpx.ConnectError as exc:
            req.outcome, req.error = "refused", f"every replica refused: {exc}"
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            req.outcome, req.error = "cut", f"{type(exc).__name__}: {exc}"
        req.end = time.monotonic()

    async def _balanced(
        self, client: httpx.AsyncClient, req: Request, body: dict, headers: dict
    ) -> None:
        """Send to the next replica; on to the following one while connections are refused."""
        first = next(self._next_gateway)
        for i in range(len(self.gateways)):
            req.gateway = self.gateways[(first + i) % len(self.gateways)]
            try:
                await self._stream(client, req, body, headers)
                return
            except httpx.ConnectError:
                if i == len(self.gateways) - 1:
                    raise
                req.skipped_replicas += 1

    async def _stream(
        self, client: httpx.AsyncClient, req: Request, body: dict, headers: dict
    ) -> None:
        url = f"{req.gateway}/v1/chat/completions"
        async with client.stream("POST", url, json=body, headers=headers) as response:
            req.request_id = response.headers.get(REQUEST_ID_HEADER, "")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                req.outcome, req.error = "clean", f"HTTP {response.status_code}: {text[:200]}"
                return
            pieces: list[str] = []
            done = False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data:"):
                    self._chunk(req, json.loads(line[5:]), pieces)
            req.text = "".join(pieces)
            if req.outcome:  # an error event came
                return
            req.outcome = "ok" if done else "cut"
            if not done:
                req.error = "the stream ended without [DONE]"

    @staticmethod
    def _chunk(req: Request, chunk: dict, pieces: list[str]) -> None:
        if "error" in chunk:
            req.outcome, req.error = "clean", f"error event: {json.dumps(chunk['error'])[:200]}"
        for choice in chunk.get("choices") or ():
            if text := (choice.get("delta") or {}).get("content"):
                pieces.append(text)
        if usage := chunk.get("usage"):
            req.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            req.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            req.cached_by_tier = dict(details.get("cached_tokens_by_tier") or {})
