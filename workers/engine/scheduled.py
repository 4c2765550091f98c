"""A request as the scheduler holds it, and how one step shares its token budget.

Kept apart from :mod:`workers.engine.scheduler` (admission, preemption, the tiers): what a
request has computed and in which pages, and which tokens of each running request the next
forward pass takes. Every decoding request gets its one token first; prefill chunks share
what the budget has left, oldest admitted request first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from workers.engine.batch import SeqChunk
from workers.engine.radix import PrefixHandle
from workers.engine.sampling import RequestSampler


@dataclass
class Scheduled:
    """One request's state in the scheduler."""

    rid: str
    namespace: str
    tokens: list[int]  # prompt, then generated tokens
    prompt_len: int
    sampler: RequestSampler
    seq: int  # admission order; the youngest is preempted first
    pages: list[int] = field(default_factory=list)
    shared: int = 0  # pages[:shared] belong to the radix cache (pinned through ``prefix``)
    prefix: PrefixHandle | None = None
    computed: int = 0  # tokens whose KV is in ``pages``
    cached_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    admitted_once: bool = False

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens not yet in the KV cache (1 while decoding)."""
        return len(self.tokens) - self.computed


@dataclass(frozen=True)
class StepPlan:
    """The chunks of one forward pass, the request of each, and whether each is (the end
    of) a prefill."""

    chunks: list[SeqChunk]
    requests: list[Scheduled]
    prefills: list[bool]


def plan_step(running: Sequence[Scheduled], token_budget: int) -> StepPlan:
    """One token for every decoding request, then prefill chunks within what
    ``token_budget`` has left, in ``running``'s order; a request left without budget sits
    this step out."""
    plan = StepPlan([], [], [])
    decoding = sum(1 for r in running if r.pending == 1)
    budget = max(token_budget - decoding, 0)
    for req in running:
        pending = req.pending
        n = 1 if pending == 1 else min(pending, budget)
        if n <= 0:
            continue
        if pending > 1:
            budget -= n
        plan.prefills.append(pending > 1)
        plan.chunks.append(
            SeqChunk(
                req.tokens[req.computed : req.computed + n], req.computed, req.pages, n == pending
            )
        )
        plan.requests.append(req)
    return plan
