"""One generation as text: engine token events -> detokenized, stop-string-aware deltas.

Shared by the OpenAI and the SGLang-native routes. Closing the returned iterator (a client
gone) or finding a stop string closes the engine's iterator, which aborts the request and
frees its pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.tiers import TIERS
from workers.engine.api import TokenEvent, TokenLogprobs
from workers.metrics import ServerMetrics
from workers.stop_strings import StopScanner


class Detokenizer(Protocol):
    """Turns a growing sequence of token ids into text, one step at a time."""

    def push(self, token_ids: Sequence[int]) -> str:
        """Append ``token_ids``; return the text they complete (never half a character)."""
        ...

    def flush(self) -> str:
        """At the end of the sequence: the text still held back."""
        ...


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request, as reported to the client."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, event: TokenEvent) -> Usage:
        """The totals carried by an engine event."""
        return cls(
            event.prompt_tokens, event.completion_tokens, event.cached_tokens, event.cached_by_tier
        )

    def tiers(self) -> dict[str, int]:
        """Cached tokens per tier, every tier present (0 when unused)."""
        return {tier: self.cached_by_tier.get(tier, 0) for tier in TIERS}

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object, with our per-tier breakdown of the cached tokens."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "cached_tokens_by_tier": self.tiers(),
            },
        }


@dataclass(frozen=True)
class TextDelta:
    """New text since the previous delta; the last delta has ``finish_reason`` set."""

    text: str
    token_ids: list[int]
    usage: Usage
    finish_reason: str | None = None
    #: one per token of ``token_ids`` when the request asked for log-probabilities
    logprobs: list[TokenLogprobs] = field(default_factory=list)


async def generate_text(
    events: AsyncIterator[TokenEvent],
    detokenizer: Detokenizer,
    stops: Sequence[str],
    metrics: ServerMetrics,
) -> AsyncIterator[TextDelta]:
    """Turn a request's engine ``events`` into text; a stop string ends it (``finish_reason="stop"``)."""
    scanner = StopScanner(stops)
    first = True
    async with aclosing(events):
        async for event in events:
            metrics.record(event, first=first)
            first = False
            text, stopped = scanner.feed(detokenizer.push(event.token_ids))
            if event.finished and not stopped:
                # The sequence is complete: release what the detokenizer and scanner held back.
                tail, stopped = scanner.feed(detokenizer.flush())
                text += tail if stopped else tail + scanner.flush()
            if stopped or event.finished:
                reason = "stop" if stopped else (event.finish_reason or "stop")
                metrics.finished(reason)
                yield TextDelta(text, event.token_ids, Usage.of(event), reason, event.logprobs)
                return
            if text or event.token_ids:
                yield TextDelta(text, event.token_ids, Usage.of(event), logprobs=event.logprobs)


async def collect(deltas: AsyncIterator[TextDelta]) -> TextDelta:
    """Run a generation to its end; one delta holding all its text and token ids."""
    texts: list[str] = []
    ids: list[int] = []
    logprobs: list[TokenLogprobs] = []
    async with aclosing(deltas):
        async for delta in deltas:
            texts.append(delta.text)
            ids.extend(delta.token_ids)
            logprobs.extend(delta.logprobs)
            if delta.finish_reason is not None:
                return TextDelta("".join(texts), ids, delta.usage, delta.finish_reason, logprobs)
    raise RuntimeError("the engine ended a request without a final event")
