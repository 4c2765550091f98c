"""Sampling: greedy, seeds, top-k/top-p cuts, min_tokens, stop ids, max_tokens."""

from __future__ import annotations

import torch
from engine_support import greedy, run, tiny_engine, tiny_llama, tokens

from workers.engine.api import SamplingParams
from workers.engine.sampling import RequestSampler, sample

CPU = torch.device("cpu")
MODEL = tiny_llama(seed=6)
PROMPT = torch.randint(3, 512, (30,), generator=torch.Generator().manual_seed(6)).tolist()


def _sampler(**params: object) -> RequestSampler:
    return RequestSampler(SamplingParams(**params), eos_token_ids=(2,), device=CPU)  # type: ignore[arg-type]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(2, 8)
    logits[:, 2] = 10.0  # EOS is the favourite
    logits[:, 5] = 9.0  # then a stop id
    s = _sampler(temperature=0.0, min_tokens=2, stop_token_ids=(5,))
    assert sample(logits.clone(), [s, s], [0, 2]) == [0, 2]
    assert s.finish_reason(2, 3) == "stop"
    assert s.finish_reason(5, 3) == "stop"
    assert s.finish_reason(7, 16) == "length"
    assert s.finish_reason(7, 3) is None


def test_ignore_eos_does_not_stop_on_eos() -> None:
    assert _sampler(ignore_eos=True).finish_reason(2, 1) is None


def test_top_k_and_top_p_cut_the_tail() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, 0.0]]).repeat(50, 1)
    top1 = [_sampler(temperature=1.0, top_k=1, seed=i) for i in range(50)]
    assert set(sample(logits.clone(), top1, [0] * 50)) == {1}
    # token 1 holds ~52% of the mass: top_p 0.5 keeps only it, top_p 0.9 keeps tokens 1 and 2
    narrow = [_sampler(temperature=1.0, top_p=0.5, seed=i) for i in range(50)]
    assert set(sample(logits.clone(), narrow, [0] * 50)) == {1}
    wide = [_sampler(temperature=1.0, top_p=0.9, seed=i) for i in range(50)]
    assert set(sample(logits.clone(), wide, [0] * 50)) == {1, 2}


def test_seed_reproduces_independent_of_the_batch() -> None:
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    alone = sample(logits[1:2].clone(), [_sampler(seed=7)], [0])
    batched = sample(logits.clone(), [_sampler(seed=1), _sampler(seed=7), _sampler()], [0] * 3)
    assert batched[1] == alone[0]


async def test_engine_sampling_end_to_end() -> None:
    engine = tiny_engine(MODEL)
    try:
        base = tokens(await run(engine, "g", PROMPT, greedy(12)))
        seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=42, ignore_eos=True)
        a = tokens(await run(engine, "s1", PROMPT, seeded))
        b = tokens(await run(engine, "s2", PROMPT, seeded))
        other = SamplingParams(max_tokens=12, temperature=1.0, seed=43, ignore_eos=True)
        c = tokens(await run(engine, "s3", PROMPT, other))
        assert a == b and a != c
        top1 = SamplingParams(max_tokens=12, temperature=0.7, top_k=1, ignore_eos=True)
        assert tokens(await run(engine, "k1", PROMPT, top1)) == base
        # stop on the 3rd greedy token: it is emitted, then the request ends
        stopped = await run(engine, "st", PROMPT, greedy(12, stop_token_ids=(base[2],)))
        assert tokens(stopped) == base[: base.index(base[2]) + 1]
        assert stopped[-1].finish_reason == "stop"
        # the same stop id with min_tokens beyond it is suppressed until then
        held = await run(engine, "mt", PROMPT, greedy(12, stop_token_ids=(base[0],), min_tokens=4))
        assert tokens(held)[0] != base[0] and len(tokens(held)) >= 4
        empty = await run(engine, "z", PROMPT, greedy(0))
        assert tokens(empty) == [] and empty[-1].finish_reason == "length"
    finally:
        engine.close()
