"""How one step shares its token budget among the running requests."""

from __future__ import annotations

import torch

from workers.engine.api import SamplingParams
from workers.engine.sampling import RequestSampler
from workers.engine.scheduled import Scheduled, plan_step


def _req(rid: str, tokens: int, computed: int) -> Scheduled:
    sampler = RequestSampler(
        SamplingParams(), eos_token_ids=(2,), device=torch.device("cpu"), vocab_size=64
    )
    return Scheduled(
        rid=rid, namespace="", tokens=list(range(tokens)), prompt_len=tokens, sampler=sampler,
        seq=0, pages=[0], computed=computed,
    )  # fmt: skip


def test_decoders_get_their_token_first_and_prefills_share_the_rest_in_order() -> None:
    a = _req("a", 100, 0)  # a prefill of 100
    b = _req("b", 41, 40)  # decoding
    c = _req("c", 30, 10)  # a prefill of 20
    plan = plan_step([a, c, b], token_budget=64)
    # b's token comes off the budget before any prefill: a gets 63, c what is left, none
    assert [r.rid for r in plan.requests] == ["a", "b"]
    assert [len(x.token_ids) for x in plan.chunks] == [63, 1]
    assert [x.start for x in plan.chunks] == [0, 40]
    assert plan.prefills == [True, False]
    # a's chunk leaves tokens to compute: no logits for it; b's token wants them
    assert [x.want_logits for x in plan.chunks] == [False, True]


def test_a_prefill_that_fits_ends_with_logits_and_the_next_takes_the_remainder() -> None:
    a, c = _req("a", 30, 10), _req("c", 100, 0)
    plan = plan_step([a, c], token_budget=64)
    assert [len(x.token_ids) for x in plan.chunks] == [20, 44]
    assert plan.chunks[0].token_ids == list(range(10, 30))
    assert [x.want_logits for x in plan.chunks] == [True, False]


def test_decoders_run_even_past_the_budget() -> None:
    reqs = [_req(str(i), 5, 4) for i in range(4)]
    plan = plan_step(reqs, token_budget=2)
    assert [len(x.token_ids) for x in plan.chunks] == [1, 1, 1, 1]
    assert plan.prefills == [False] * 4
