"""Log-probabilities from the engine: the model's own distribution at each generated
position, as a separate full forward pass of the same weights (transformers) computes it."""

from __future__ import annotations

import pytest
import torch

from tests.support.engine import TinyModel, greedy, run, run_together, tiny_engine, tiny_llama
from workers.engine.api import GenerateRequest, SamplingParams, TokenEvent
from workers.engine.sampling import SamplingError

MODEL = tiny_llama(seed=11)
PROMPT = torch.randint(3, 512, (21,), generator=torch.Generator().manual_seed(11)).tolist()


def _recomputed(model: TinyModel, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """``[len(generated), vocab]``: the log-softmax before each generated token, from one
    forward pass over prompt + generated tokens."""
    ids = prompt + generated
    with torch.no_grad():
        logits = model.reference(torch.tensor([ids])).logits[0].float()
    return logits[len(prompt) - 1 : len(ids) - 1].log_softmax(-1)


def _check(events: list[TokenEvent], k: int, prompt: list[int] = PROMPT) -> None:
    generated = [t for e in events for t in e.token_ids]
    entries = [lp for e in events for lp in e.logprobs]
    assert len(entries) == len(generated) > 0
    expected = _recomputed(MODEL, prompt, generated)
    for pos, (token, entry) in enumerate(zip(generated, entries, strict=True)):
        assert entry.logprob == pytest.approx(float(expected[pos, token]), abs=1e-4)
        assert len(entry.top) == k
        values, ids = expected[pos].topk(k)
        assert [i for i, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


async def test_greedy_logprobs_match_a_separate_forward_pass() -> None:
    engine = tiny_engine(MODEL, kv_dtype="float32")
    try:
        events = await run(engine, "a", PROMPT, greedy(12, logprobs=5))
    finally:
        engine.close()
    _check(events, 5)
    # greedy takes the most likely token: its logprob is the first alternative's
    assert all(e.top[0][1] == e.logprob for ev in events for e in ev.logprobs)


async def test_sampled_tokens_report_the_model_distribution_not_the_tempered_one() -> None:
    """temperature, top_k and top_p shape what is drawn, not what is reported (as OpenAI's
    log-probabilities do not move with temperature)."""
    engine = tiny_engine(MODEL, kv_dtype="float32")
    params = SamplingParams(
        max_tokens=10, temperature=1.7, top_k=40, top_p=0.9, seed=3, ignore_eos=True, logprobs=3
    )
    try:
        events = await run(engine, "a", PROMPT, params)
    finally:
        engine.close()
    _check(events, 3)


async def test_rows_that_asked_get_logprobs_beside_rows_that_did_not() -> None:
    engine = tiny_engine(MODEL, kv_dtype="float32")
    other = PROMPT[::-1]
    try:
        asked, plain, none_k = await run_together(
            engine,
            ("asked", PROMPT, greedy(8, logprobs=20)),
            ("plain", other, greedy(8)),
            ("zero", other[3:], greedy(6, logprobs=0)),
        )
        alone = await run(engine, "alone", PROMPT, greedy(8, logprobs=20))
    finally:
        engine.close()
    _check(asked, 20)
    _check(none_k, 0, other[3:])
    assert all(e.logprobs == [] for e in plain)
    # batched or alone, the same tokens with the same log-probabilities
    assert [e.token_ids for e in asked] == [e.token_ids for e in alone]
    for a, b in zip(asked, alone, strict=True):
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def test_more_alternatives_than_the_bound_are_refused() -> None:
    engine = tiny_engine(MODEL)
    try:
        with pytest.raises(SamplingError) as err:
            engine.generate(GenerateRequest("r", tuple(PROMPT), greedy(4, logprobs=21)))
    finally:
        engine.close()
    assert err.value.field == "logprobs"
