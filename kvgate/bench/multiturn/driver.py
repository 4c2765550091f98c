"""Closed-loop clients that play multi-turn conversations against an OpenAI-compatible URL.

``C`` clients share ``K`` active conversations (``K > C``), taking turns round-robin: a
conversation whose answer has arrived goes to the back of the queue, so many turns of
other conversations pass before its next one and the server's device cache must evict in
between. Every turn sends the whole history, including the server's real earlier answers,
streams the reply and records what the client saw (time to first token, time per output
token, latency) and what the server reported (prompt, cached and output tokens).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
from tqdm import tqdm

from kvgate.bench.multiturn.workload import Conversation
from protocol.fields import CACHE_SALT_FIELDS

#: Extra headers per (conversation id, turn index): how a run steers a gateway's routing.
HeadersFor = Callable[[str, int], dict[str, str]]


@dataclass
class Result:
    """One request as measured by the client."""

    cid: str
    turn: int
    start: float
    ttft: float = 0.0
    latency: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    warmup: bool = False
    error: str = ""

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first."""
        return (self.latency - self.ttft) / max(1, self.output_tokens - 1)


@dataclass(frozen=True)
class Target:
    """Where to send requests."""

    url: str
    api_key: str = ""
    model: str = ""
    timeout_s: float = 1800.0
    #: the ``cache_salt`` to send (a worker's KV namespace); a gateway sets its own
    cache_salt: str = ""


@dataclass(frozen=True)
class Plan:
    """How to play the conversations."""

    clients: int = 8
    #: conversations in play at once (K); more start as others finish
    active: int = 16
    #: the first this many requests are played but left out of the statistics
    warmup: int = 0
    #: stop issuing after this many requests (0: play every turn of every conversation)
    max_requests: int = 0
    think_time_s: float = 0.0
    temperature: float = 0.0


class History:
    """A conversation in progress: its messages so far (with the server's real answers)
    and the next turn. :func:`run` moves it on; :meth:`copy` lets several servers go on
    from the same point (the comparison plays every configuration from one priming)."""

    def __init__(self, conv: Conversation) -> None:
        self.conv = conv
        self.messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
        self.next_turn = 0
        #: KV tokens of the history as the server counted them (prompt and answer of the
        #: last turn played; 0 before the first)
        self.kv_tokens = 0

    @property
    def done(self) -> bool:
        return self.next_turn >= len(self.conv.turns)

    def copy(self) -> History:
        """An independent copy at the same point."""
        other = History(self.conv)
        other.messages, other.next_turn = list(self.messages), self.next_turn
        other.kv_tokens = self.kv_tokens
        return other


async def model_of(client: httpx.AsyncClient, target: Target) -> str:
    """``target.model``, or the first model the server lists."""
    if target.model:
        return target.model
    response = await client.get(f"{target.url}/v1/models", headers=_auth(target))
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run(
    target: Target,
    conversations: Sequence[Conversation | History],
    plan: Plan,
    *,
    headers_for: HeadersFor | None = None,
    progress: bool = True,
) -> list[Result]:
    """Play ``conversations`` per ``plan``; one :class:`Result` per request, in issue order.

    A :class:`History` goes on from where it is (and is moved on in place); a
    :class:`Conversation` starts from its first turn.
    """
    if plan.clients < 1 or plan.active < 1:
        raise ValueError("clients and active conversations must be at least 1")
    plays = [c if isinstance(c, History) else History(c) for c in conversations]
    pending = deque(p for p in plays if not p.done)
    ready: deque[History] = deque()
    for _ in range(min(plan.active, len(pending))):
        ready.append(pending.popleft())
    total = sum(len(p.conv.turns) - p.next_turn for p in plays)
    if plan.max_requests:
        total = min(total, plan.max_requests)
    results: list[Result] = []
    wake = asyncio.Condition()
    in_flight = 0
    bar = tqdm(total=total, desc="requests", unit="req", disable=not progress, leave=False)
    limits = httpx.Limits(max_connections=plan.clients + 4)
    async with httpx.AsyncClient(timeout=target.timeout_s, limits=limits) as client:
        model = await model_of(client, target)

        async def take() -> History | None:
            nonlocal in_flight
            async with wake:
                while True:
                    if len(results) >= total:
                        return None
                    if ready:
                        in_flight += 1
                        return ready.popleft()
                    if not in_flight:
                        return None
                    await wake.wait()

        async def give_back(play: History) -> None:
            nonlocal in_flight
            async with wake:
                in_flight -= 1
                if not play.done:
                    ready.append(play)
                elif pending:
                    ready.append(pending.popleft())
                wake.notify_all()

        async def client_loop() -> None:
            while (play := await take()) is not None:
                result = Result(play.conv.cid, play.next_turn, 0.0)
                result.warmup = len(results) < plan.warmup
                results.append(result)
                extra = headers_for(play.conv.cid, play.next_turn) if headers_for else {}
                await _turn(client, target, model, play, plan, result, extra)
                bar.update(1)
                if plan.think_time_s:
                    await asyncio.sleep(plan.think_time_s)  # the user reading the answer
                await give_back(play)

        try:
            await asyncio.gather(*(client_loop() for _ in range(plan.clients)))
        finally:
            bar.close()
    return results


async def _turn(
    client: httpx.AsyncClient,
    target: Target,
    model: str,
    play: History,
    plan: Plan,
    result: Result,
    headers: dict[str, str],
) -> None:
    """Send one turn, then append it and the answer that came back to the history."""
    turn = play.conv.turns[play.next_turn]
    messages = [*play.messages, {"role": "user", "content": turn.user}]
    answer = await send(
        client, target, model, messages, turn.answer_tokens, result,
        temperature=plan.temperature, headers=headers,
    )  # fmt: skip
    # The conversation goes on with whatever came back, as a user would read it.
    play.messages = [*messages, {"role": "assistant", "content": answer}]
    play.next_turn += 1
    play.kv_tokens = result.prompt_tokens + result.output_tokens


def chat_body(
    model: str, messages: list[dict[str, str]], answer_tokens: int, temperature: float
) -> dict:
    """A streamed chat completion of exactly ``answer_tokens`` tokens, usage at its end."""
    return {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": answer_tokens,
        "min_tokens": answer_tokens,
        "temperature": temperature,
    }


async def send(
    client: httpx.AsyncClient,
    target: Target,
    model: str,
    messages: list[dict[str, str]],
    answer_tokens: int,
    result: Result,
    *,
    temperature: float = 0.0,
    headers: dict[str, str] | None = None,
) -> str:
    """Stream one chat completion of exactly ``answer_tokens`` tokens into ``result``.

    Returns the answer text. A failure is recorded in ``result.error``, never raised: one
    bad request must not end a run that took minutes to set up.
    """
    body = chat_body(model, messages, answer_tokens, temperature)
    if target.cache_salt:  # the fields a gateway would set (it overwrites them anyway)
        body |= {name: target.cache_salt for name in CACHE_SALT_FIELDS}
    answer: list[str] = []
    result.start = time.perf_counter()
    try:
        async with client.stream(
            "POST",
            f"{target.url}/v1/chat/completions",
            json=body,
            headers=_auth(target) | (headers or {}),
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {response.status_code}: {text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                for choice in chunk.get("choices") or ():
                    # The opening chunk only names the role: the first token is the first text.
                    text = (choice.get("delta") or {}).get("content")
                    if text or choice.get("finish_reason"):
                        result.ttft = result.ttft or time.perf_counter() - result.start
                    if text:
                        answer.append(text)
                if chunk.get("usage"):
                    _usage(result, chunk["usage"])
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as exc:
        result.error = str(exc) or type(exc).__name__
    result.latency = time.perf_counter() - result.start
    return "".join(answer)


def _usage(result: Result, usage: dict) -> None:
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.output_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = int(details.get("cached_tokens") or 0)
    result.cached_by_tier = {
        k: int(v) for k, v in (details.get("cached_tokens_by_tier") or {}).items() if v
    }


def _auth(target: Target) -> dict[str, str]:
    return {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
