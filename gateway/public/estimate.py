"""What one conversation costs with kvgate's cache and without it: the pricing estimator.

Every turn resends the whole conversation. Turn ``k`` (from 1) sends the history the
conversation started with (``history`` tokens: a system prompt, a document), every earlier
message and answer, and its new message, so its prompt is
``history + (k - 1) * (message + answer) + message`` tokens. Without a cache each prompt is
paid as input in full. With kvgate's, everything but the new message comes back from a KV
tier from the second turn on (the answers' KV too: the worker keeps what it generated), so
turn ``k`` has ``history + (k - 1) * (message + answer)`` cached tokens, paid at the cached
price. Page granularity (a few tokens short of a page are recomputed) is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from starlette.datastructures import QueryParams

from gateway.billing.config import TokenPrices


@dataclass(frozen=True)
class Conversation:
    """The shape the visitor typed in."""

    turns: int = 20
    history: int = 2000
    message: int = 150
    answer: int = 300


#: field -> (label, least, most): what the form accepts
FIELDS: dict[str, tuple[str, int, int]] = {
    "turns": ("Turns", 1, 1000),
    "history": ("History at the start (tokens)", 0, 1_000_000),
    "message": ("New tokens per message", 1, 100_000),
    "answer": ("Tokens per answer", 0, 100_000),
}


@dataclass(frozen=True)
class Estimate:
    """Token counts and dollars of one conversation, with the cache and without it."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    without_cache: Decimal
    with_cache: Decimal

    @property
    def saved_share(self) -> float:
        """The fraction of the uncached cost that the cache saves."""
        if not self.without_cache:
            return 0.0
        return float(1 - self.with_cache / self.without_cache)


def estimate(conv: Conversation, prices: TokenPrices) -> Estimate:
    """The cost of ``conv`` at ``prices``, summed turn by turn in closed form."""
    t, step = conv.turns, conv.message + conv.answer
    earlier = step * t * (t - 1) // 2  # sum over turns of (k - 1) * (message + answer)
    prompts = t * (conv.history + conv.message) + earlier
    cached = (t - 1) * conv.history + earlier
    output = t * conv.answer
    return Estimate(
        input_tokens=prompts,
        cached_tokens=cached,
        output_tokens=output,
        without_cache=prices.cost(prompts, 0, output),
        with_cache=prices.cost(prompts - cached, cached, output),
    )


def parse(query: QueryParams) -> tuple[Conversation, dict[str, str]]:
    """The conversation in ``query`` (defaults for absent fields) and a field -> problem map;
    on any problem, the defaults stand in for the bad field."""
    values: dict[str, int] = {}
    errors: dict[str, str] = {}
    for name, (label, least, most) in FIELDS.items():
        raw = query.get(name, "").strip()
        if not raw:
            continue
        digits = raw.isascii() and raw.isdigit() and len(raw) <= 9
        if not digits or not least <= int(raw) <= most:
            errors[name] = f"{label}: a whole number from {least:,} to {most:,}."
            continue
        values[name] = int(raw)
    return Conversation(**values), errors
