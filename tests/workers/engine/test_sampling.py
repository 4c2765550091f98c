"""Sampling: greedy, seeds, top-k/top-p cuts, min_tokens, stop ids, max_tokens, and that
one request's sampling values or logits never fail the others in its batch."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.engine import greedy, run, run_together, tiny_engine, tiny_llama, tokens
from workers.engine.api import GenerateRequest, SamplingParams
from workers.engine.sampling import RequestSampler, SamplingError, check_sampling, sample

CPU = torch.device("cpu")
MODEL = tiny_llama(seed=6)
VOCAB = MODEL.config.vocab_size  # 512
PROMPT = torch.randint(3, 512, (30,), generator=torch.Generator().manual_seed(6)).tolist()


def _sampler(**params: object) -> RequestSampler:
    return RequestSampler(SamplingParams(**params), eos_token_ids=(2,), device=CPU, vocab_size=64)  # type: ignore[arg-type]


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


def test_a_seeded_request_draws_the_same_beside_requests_with_cuts() -> None:
    """A neighbour with top_p or top_k must not change how a request without a cut draws
    (20 draws: a different path would pick another token from the same generator state)."""
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    lone, paired = _sampler(seed=42), _sampler(seed=42)
    neighbour = _sampler(seed=3, top_p=0.9, top_k=20)
    alone = [sample(logits[:1].clone(), [lone], [0])[0] for _ in range(20)]
    beside = [sample(logits.clone(), [paired, neighbour], [0, 0])[0] for _ in range(20)]
    assert beside == alone


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


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 1e39}, "temperature"),  # inf in float32
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop_token_ids": (VOCAB,)}, "stop_token_ids"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
    ],
)
def test_check_sampling_names_the_field_a_step_could_not_take(
    params: dict[str, object], field: str
) -> None:
    with pytest.raises(SamplingError) as err:
        check_sampling(SamplingParams(**params), VOCAB)  # type: ignore[arg-type]
    assert err.value.field == field


def test_an_unsampleable_row_yields_none_and_the_others_draw_as_without_it() -> None:
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    alone = sample(logits[[0, 2]].clone(), [_sampler(seed=3), _sampler(seed=4)], [0, 0])
    logits[1] = float("nan")
    batched = sample(logits, [_sampler(seed=3), _sampler(seed=5), _sampler(seed=4)], [0, 0, 0])
    assert batched == [alone[0], None, alone[1]]


async def test_bad_sampling_values_are_refused_before_they_join_a_batch() -> None:
    """Each of these used to raise inside the shared step, which aborted every request."""
    engine = tiny_engine(MODEL)
    try:
        base = tokens(await run(engine, "g", PROMPT, greedy(6)))
        bad = {
            "stop_token_ids": greedy(6, stop_token_ids=(10**9,), min_tokens=1),
            "seed": SamplingParams(max_tokens=6, seed=2**64),
            "temperature": SamplingParams(max_tokens=6, temperature=math.inf, min_tokens=1),
        }
        for field, params in bad.items():
            with pytest.raises(SamplingError, match=field):
                engine.generate(GenerateRequest(f"bad-{field}", tuple(PROMPT), params))
        assert tokens(await run(engine, "g2", PROMPT, greedy(6))) == base
    finally:
        engine.close()


async def test_tiny_temperatures_are_greedy_and_a_huge_top_k_keeps_every_token() -> None:
    """A 1e-46 temperature is 0.0 in float32 and a top_k past int64 overflowed the cut's
    tensor: both used to fail the step and with it the greedy request beside them."""
    engine = tiny_engine(MODEL)
    try:
        base = tokens(await run(engine, "g", PROMPT, greedy(8)))
        whole_vocab = tokens(
            await run(
                engine, "k", PROMPT, SamplingParams(8, 1.0, top_k=VOCAB, seed=9, ignore_eos=True)
            )
        )
        beside, tiny, huge_k = await run_together(
            engine,
            ("beside", PROMPT, greedy(8)),
            ("tiny", PROMPT, SamplingParams(max_tokens=8, temperature=1e-46, ignore_eos=True)),
            ("huge-k", PROMPT, SamplingParams(8, 1.0, top_k=2**63, seed=9, ignore_eos=True)),
        )
        assert tokens(beside) == base and beside[-1].finish_reason == "length"
        assert tokens(tiny) == base and tiny[-1].finish_reason == "length"
        assert tokens(huge_k) == whole_vocab and huge_k[-1].finish_reason == "length"
    finally:
        engine.close()


async def test_a_request_with_nothing_to_sample_ends_alone() -> None:
    """Every token is a stop id held back by min_tokens: the sampled row is all -inf and
    its distribution NaN. That request ends with abort; the greedy one beside it, in the
    same steps, runs to its length with the tokens it has alone."""
    engine = tiny_engine(MODEL)
    try:
        base = tokens(await run(engine, "g", PROMPT, greedy(8)))
        empty = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=tuple(range(VOCAB)))
        beside, doomed = await run_together(
            engine, ("beside", PROMPT, greedy(8)), ("doomed", PROMPT[:10], empty)
        )
        assert tokens(beside) == base and beside[-1].finish_reason == "length"
        assert tokens(doomed) == [] and doomed[-1].finish_reason == "abort"
        load = engine.load()  # nothing left running, and the aborted request's pages freed
        assert load.running == load.queued == 0 and load.pool_used_pages == load.cached_pages
    finally:
        engine.close()
