"""Picking next tokens for a batch of requests, each with its own sampling parameters.

Greedy rows take the argmax. Sampled rows are tempered, the rows with a cut are cut by
top-k and top-p in one batched sort, and each row is drawn with the request's own
``torch.Generator``, from the distribution it would have alone, so that a fixed seed
reproduces the same tokens whatever else shares the batch.

Parameters are checked when a request's :class:`RequestSampler` is built, before the
request joins a batch: one request's bad values must not fail a step that other requests
share. A row whose distribution still comes out unusable (non-finite logits, every token
masked) yields None from :func:`sample` and the other rows are drawn as usual.

A request with a grammar (structured output, forced tool calls) has its logits masked to
what the grammar allows before anything else (:mod:`workers.engine.grammar`), and ends
when the grammar is complete; ``min_tokens`` does not hold it back then.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from workers.engine.api import FinishReason, SamplingParams
from workers.engine.grammar import GrammarState, constrain
from workers.engine.logprobs import MAX_TOP_LOGPROBS

#: Temperatures below this are greedy. Dividing logits by a smaller one overflows float32
#: (and 1e-46 *is* 0.0 in float32), which leaves no distribution to draw from; vLLM treats
#: temperatures under the same bound as greedy, and the output is the argmax either way.
GREEDY_TEMPERATURE = 1e-5
#: The largest temperature that stays finite in float32, where logits are divided by it.
MAX_TEMPERATURE = float(torch.finfo(torch.float32).max)
#: Seeds ``torch.Generator.manual_seed`` takes: any signed or unsigned 64-bit integer.
SEED_RANGE = (-(2**63), 2**64 - 1)


class SamplingError(ValueError):
    """Sampling parameters the engine cannot honour; ``field`` names the SamplingParams field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Raise :class:`SamplingError` unless ``params`` can be sampled over ``vocab_size`` ids.

    Every value that would make a batched step raise (or draw from NaN) is refused here,
    so that the request fails alone, before it is queued.
    """
    if params.max_tokens < 0:
        raise SamplingError("max_tokens", "must be >= 0")
    if params.min_tokens < 0:
        raise SamplingError("min_tokens", "must be >= 0")
    t = params.temperature
    if not (math.isfinite(t) and 0.0 <= t <= MAX_TEMPERATURE):
        raise SamplingError(
            "temperature", f"{t!r} is not a finite number >= 0; send 0 for greedy decoding"
        )
    if not 0.0 < params.top_p <= 1.0:  # also refuses NaN
        raise SamplingError("top_p", f"{params.top_p!r} is not in (0, 1]")
    if params.top_k < 0:
        raise SamplingError("top_k", f"{params.top_k} is negative; send 0 to turn top-k off")
    if params.seed is not None and not SEED_RANGE[0] <= params.seed <= SEED_RANGE[1]:
        raise SamplingError("seed", f"{params.seed} does not fit in 64 bits")
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        raise SamplingError("logprobs", f"{params.logprobs} is not in [0, {MAX_TOP_LOGPROBS}]")
    bad = [i for i in params.stop_token_ids if not 0 <= i < vocab_size]
    if bad:
        raise SamplingError(
            "stop_token_ids",
            f"{bad[0]} is not a token id of this model: ids lie in [0, {vocab_size})",
        )


class RequestSampler:
    """One request's sampling state: its parameters, its generator, its stop rules.

    Building one checks the parameters (:func:`check_sampling`), so a sampler that exists
    can always take part in :func:`sample`.
    """

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        device: torch.device,
        *,
        vocab_size: int,
    ) -> None:
        check_sampling(params, vocab_size)
        self.params = params
        self.greedy = params.temperature < GREEDY_TEMPERATURE
        #: ``top_k`` cut to the vocabulary (a larger one keeps every token, as the whole
        #: vocabulary does, and would overflow the int64 tensor the cut is computed in)
        self.top_k = min(params.top_k, vocab_size)
        self.generator: torch.Generator | None = None
        if not self.greedy:
            seed = params.seed if params.seed is not None else random.getrandbits(63)
            self.generator = torch.Generator(device=device).manual_seed(seed)
        eos = () if params.ignore_eos else tuple(eos_token_ids)
        self.stop_ids = frozenset(eos) | frozenset(params.stop_token_ids)
        #: where the request is in its grammar, if it has one
        self.grammar = GrammarState(params.grammar) if params.grammar is not None else None
        #: ids suppressed until ``min_tokens`` have been generated (a grammar decides alone)
        self.banned = sorted(self.stop_ids) if self.grammar is None else []

    def finish_reason(self, token: int, n_generated: int) -> FinishReason | None:
        """Why the request ends after emitting ``token`` as its ``n_generated``-th token."""
        if token in self.stop_ids or (self.grammar is not None and self.grammar.terminated):
            return "stop"
        if n_generated >= self.params.max_tokens:
            return "length"
        return None


def _argmax(logits: torch.Tensor) -> list[int]:
    """First index of each row's maximum (ties resolve as in ``torch.argmax``)."""
    if logits.device.type == "cpu":
        # torch's CPU argmax over a row of a 2-D tensor is ~15x slower than numpy's SIMD one
        # (4 ms for 32 x 49k logits): a tenth of a decode step.
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def sample(
    logits: torch.Tensor, samplers: Sequence[RequestSampler], n_generated: Sequence[int]
) -> list[int | None]:
    """One token per row of ``logits`` (``[batch, vocab]``, float), or None for a sampled
    row that has no distribution to draw from (NaN or infinite logits, every token masked).

    ``n_generated[i]`` is how many tokens row ``i``'s request has produced so far; stop and
    EOS ids are masked out while it is below that request's ``min_tokens``. A None row
    does not change what the other rows draw: each row draws from its own generator. A row
    with a grammar draws among the tokens it allows, and its grammar takes the token drawn.
    """
    logits = logits.float()
    constrain(logits, [s.grammar for s in samplers])
    out = _draw(logits, samplers, n_generated)
    for i, s in enumerate(samplers):
        token = out[i]
        if s.grammar is not None and token is not None and not s.grammar.accept(token):
            out[i] = None  # the grammar allowed nothing drawable (NaN logits): no distribution
    return out


def _draw(
    logits: torch.Tensor, samplers: Sequence[RequestSampler], n_generated: Sequence[int]
) -> list[int | None]:
    """:func:`sample`'s draw from ``logits`` already masked by the rows' grammars."""
    for i, s in enumerate(samplers):
        if s.banned and n_generated[i] < s.params.min_tokens:
            logits[i, s.banned] = float("-inf")
    out: list[int | None] = list(_argmax(logits))
    rows = [i for i, s in enumerate(samplers) if not s.greedy]
    if not rows:
        return out
    sub = logits[rows]
    temps = torch.tensor([samplers[i].params.temperature for i in rows], device=sub.device)
    sub = sub / temps[:, None]
    # Each row draws the way it would alone: a cut (top-k, top-p) draws from its sorted
    # distribution, the rest from the plain one, whatever else shares the batch (the same
    # generator state picks another index in a sorted vector than in an unsorted one).
    cut = [j for j, i in enumerate(rows) if samplers[i].top_k > 0 or samplers[i].params.top_p < 1]
    draws: list[tuple[torch.Tensor, torch.Tensor | None]] = [(p, None) for p in sub.softmax(-1)]
    if cut:
        sorted_sub, order = sub[cut].sort(dim=-1, descending=True)
        probs = sorted_sub.softmax(dim=-1)
        ranks = torch.arange(sub.shape[-1], device=sub.device)
        cut_rows = [samplers[rows[j]] for j in cut]
        top_k = torch.tensor([s.top_k or sub.shape[-1] for s in cut_rows], device=sub.device)
        # top_p 1 keeps everything (float32 sums reach 1.0 before the tail ends)
        top_p = torch.tensor(
            [s.params.top_p if s.params.top_p < 1 else math.inf for s in cut_rows],
            device=sub.device,
        )
        # keep a token while the mass before it is below top_p (the first is always kept)
        drop = (ranks[None, :] >= top_k[:, None]) | (probs.cumsum(-1) - probs >= top_p[:, None])
        probs = probs.masked_fill(drop, 0.0)
        for k, j in enumerate(cut):
            draws[j] = (probs[k], order[k])
    for j, i in enumerate(rows):
        probs_j, order_j = draws[j]
        # multinomial raises on such a row (on CUDA it trips a device assert), so skip it
        if not bool(torch.isfinite(probs_j).all()) or not float(probs_j.sum()) > 0:
            out[i] = None
            continue
        pick = torch.multinomial(probs_j, 1, generator=samplers[i].generator)
        if order_j is not None:
            pick = order_j[pick]
        out[i] = int(pick.item())
    return out
