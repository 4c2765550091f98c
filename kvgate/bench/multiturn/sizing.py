"""How big a comparison is: device pools from the workload, the work from the machine's speed.

Pools. In every configuration but ``infinite`` the device pool (L1) holds what the
concurrent requests need at once: ``clients`` times the largest request the measured
phase sends (its history, message, answer and template), plus the page of headroom
admission keeps per request. Decoding therefore batches exactly as it would with infinite
memory; what the pool cannot hold is the conversations waiting for their next turn, and
enough conversations are primed that those add up to ``idle_over_pool`` times the pool.
``infinite`` gets a pool that holds every history the run will ever have.

Work. :func:`calibrate` times three prefills and a decode batch on a worker of this machine;
:class:`Rates` turns that into seconds for a request, so that ``--quick`` sizes its
measured phases to a time budget (:func:`measured_requests`) instead of a guess: a faster
machine plays more requests, a slower one fewer, and the run still ends in minutes.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

from kvgate.bench.multiturn.driver import History, Result, Target, model_of, send
from kvgate.bench.multiturn.metrics import percentile
from kvgate.bench.multiturn.workload import Conversation, words

#: template tokens per chat message (role markers, separators), an upper bound for SmolLM2
TEMPLATE_TOKENS_PER_MESSAGE = 8
PAGE_TOKENS = 16
#: prompt lengths of the calibration's prefills. Per-token prefill time is fitted as a line
#: through them (attention's share grows with the prompt); the longest stands for docqa's
#: 3-6k-token documents: a line through 384 and 1536 alone predicted a 4k-token prefill at
#: 1.7 ms a token where it took 2.0, and a quick run planned to end in 770 s took 903.
CALIBRATION_PROMPTS = (384, 1536, 4096)
CALIBRATION_ANSWER = 16


def request_tokens(conv: Conversation, turn: int) -> int:
    """Tokens the request of ``conv``'s turn ``turn`` needs in the pool: history, message,
    answer at its asked length and template, with a page of headroom."""
    messages = 1 + 2 * (turn + 1)
    return conv.tokens(turn + 1) + messages * TEMPLATE_TOKENS_PER_MESSAGE + PAGE_TOKENS


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS) * PAGE_TOKENS


def pool_tokens(convs: list[Conversation], clients: int, turns: range) -> int:
    """A pool for ``clients`` requests at once, each as large as the largest of ``turns``."""
    largest = max(request_tokens(c, t) for c in convs for t in turns if t < len(c.turns))
    return _pages(clients * largest)


def primed(
    convs: list[Conversation], clients: int, first_measured: int, idle_over_pool: float
) -> int:
    """How many of ``convs`` to prime (the fewest, at least ``clients`` + 1) so that, with
    ``clients`` in flight, the others' histories add up to ``idle_over_pool`` x the pool
    of the measured turns. ValueError when ``convs`` are too few."""
    for k in range(clients + 1, len(convs) + 1):
        chosen = convs[:k]
        pool = pool_tokens(chosen, clients, range(first_measured, first_measured + 1))
        sizes = sorted(c.tokens(first_measured) for c in chosen)
        if sum(sizes[:-clients]) >= idle_over_pool * pool:
            return k
    raise ValueError(f"{len(convs)} conversations cannot make {idle_over_pool}x the pool idle")


def infinite_pool_tokens(
    convs: list[Conversation], primed: list[History], clients: int, last_turn: int
) -> int:
    """A pool that holds every history through turn ``last_turn``, and room to grow.

    The primed histories are counted as the server counted them (an answer's text may
    tokenize longer than the answer was), twice over: the turn that brings a history in
    and the measured turns after it add pages of their own."""
    grown = sum(request_tokens(c, min(last_turn, len(c.turns) - 1)) - c.tokens(1) for c in convs)
    held = sum(h.kv_tokens for h in primed)
    return _pages(2 * held + grown + pool_tokens(convs, clients, range(last_turn + 1)))


@dataclass(frozen=True)
class Rates:
    """What :func:`calibrate` measured: prefill seconds as ``a n + b n^2`` for an ``n``-token
    prompt, the seconds of one decode step with ``clients`` short requests in the batch, and
    what each token of a request's context adds to its share of a step (a decode step reads
    every sequence's whole KV: at 2k tokens SmolLM2's step on a 2-core EPYC is ~40% slower
    than at 16)."""

    prefill_a: float
    prefill_b: float
    decode_step_s: float
    clients: int
    worker_start_s: float
    decode_per_context_s: float = 0.0

    def prefill_s(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill ``new`` tokens after ``cached`` tokens already in the pool."""
        end = cached + new
        return self.prefill_a * new + self.prefill_b * (end * end - cached * cached)

    def request_s(self, prompt: int, cached: int, answer: int) -> float:
        """One request's share of the machine when ``clients`` run at once: its prefill,
        and its answer's decode steps shared with the others in the batch, each also
        reading the request's own context (``prompt`` tokens and the answer so far)."""
        context = prompt + answer / 2
        step = self.decode_step_s / self.clients + self.decode_per_context_s * context
        return self.prefill_s(prompt - cached, cached) + answer * step

    def as_dict(self) -> dict[str, float]:
        """Plain values for JSON, with the prefill rate at each calibration length."""
        rates = {f"prefill_tokens_per_s_{n}": n / self.prefill_s(n) for n in CALIBRATION_PROMPTS}
        return asdict(self) | rates


def calibrate(url: str, clients: int, worker_start_s: float, seed: int = 0) -> Rates:
    """Time cold prefills of each :data:`CALIBRATION_PROMPTS` length and ``clients``
    concurrent decodes on the worker at ``url``."""
    return asyncio.run(_calibrate(url, clients, worker_start_s, seed))


async def _calibrate(url: str, clients: int, worker_start_s: float, seed: int) -> Rates:
    rng = random.Random(f"calibrate-{seed}")
    target = Target(url)
    async with httpx.AsyncClient(timeout=1800) as client:
        model = await model_of(client, target)

        async def ask(n: int, answer: int) -> Result:
            result = Result("calibrate", 0, 0.0)
            messages = [{"role": "user", "content": words(rng, n)}]
            await send(client, target, model, messages, answer, result)
            if result.error:
                raise RuntimeError(f"calibration request failed: {result.error}")
            return result

        await ask(32, 2)  # first-touch costs of a fresh process are not the machine's rate
        prefills = [await ask(n, CALIBRATION_ANSWER) for n in CALIBRATION_PROMPTS]
        alone = await ask(16, CALIBRATION_ANSWER)
        batch = await asyncio.gather(*(ask(16, CALIBRATION_ANSWER) for _ in range(clients)))
    a, b = fit_prefill([(r.prompt_tokens - r.cached_tokens, r.ttft) for r in prefills])
    long = prefills[-1]
    step = percentile([r.tpot for r in batch], 50)
    per_context = max(0.0, (long.tpot - alone.tpot) / (long.prompt_tokens - alone.prompt_tokens))
    return Rates(a, b, step, clients, worker_start_s, per_context)


def fit_prefill(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``t = a n + b n^2`` for ``(n tokens, t seconds)`` prefills of at least
    two lengths: the least squares line through their per-token times ``t / n = a + b n``.
    ``b >= 0`` (attention never makes tokens cheaper; the mean per-token time then) and
    ``a > 0``."""
    xs, ys = [n for n, _ in points], [t / n for n, t in points]
    b, a = statistics.linear_regression(xs, ys)
    if b < 0:
        a, b = statistics.fmean(ys), 0.0
    return max(a, 1e-6), b


def measured_requests(budget_s: float, per_request_s: float, low: int, high: int) -> int:
    """The most requests (between ``low`` and ``high``) that ``budget_s`` pays for."""
    return max(low, min(high, int(budget_s / max(per_request_s, 1e-6))))
