"""A time budget for ``--quick``: predicted seconds of every phase from the calibrated rates,
and the measured turns per configuration that the budget leaves room for.

Priming, the restore turns and the no-reuse pair have fixed sizes (the pools and the
targets decide them); what scales with the machine is how many follow-up turns each
configuration plays. The prediction and the seconds each phase really took both go into
the report, so that a budget that was missed says which phase overran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.bench.multiturn.compare import CONFIGS, Compare
from kvgate.bench.multiturn.sizing import Rates, measured_requests, request_tokens

#: processes each configuration starts (workers, gateway, agents, tierd) in worker starts
STARTS = {"gateway_shared": 2.0, "object": 1.5}
#: the share of the budget kept back for what the prediction leaves out (services, plots)
MARGIN = 0.1


@dataclass(frozen=True)
class Costs:
    """One workload's predicted seconds: priming, and per configuration its start and one
    measured turn."""

    priming_s: float
    start_s: dict[str, float]
    per_turn_s: dict[str, float]

    def configs_s(self, measured: int, only: Sequence[str]) -> float:
        """Seconds of every configuration in ``only`` playing ``measured`` turns."""
        return sum(self.start_s[c] + measured * self.per_turn_s[c] for c in only)


def costs(compare: Compare, rates: Rates) -> Costs:
    """Predicted seconds of ``compare``'s phases on a machine of ``rates``."""
    common = compare.spec.shape.common_prefix
    priming = 0.0
    cached, recomputed = [], []
    for i, conv in enumerate(compare.workload):
        first = request_tokens(conv, 0)
        priming += rates.request_s(first, common if i else 0, conv.turns[0].answer_tokens)
        if len(conv.turns) > 1:
            prompt = request_tokens(conv, 1) - conv.turns[1].answer_tokens
            answer = conv.turns[1].answer_tokens
            cached.append(rates.request_s(prompt, first, answer))
            recomputed.append(rates.request_s(prompt, common, answer))
    hit = sum(cached) / max(1, len(cached))
    miss = sum(recomputed) / max(1, len(recomputed))
    per_turn = {c: (miss if c == "recompute" else hit) for c in CONFIGS}
    start = {c: STARTS.get(c, 1.0) * rates.worker_start_s for c in CONFIGS}
    return Costs(priming, start, per_turn)


def restore_s(rates: Rates, lengths: Sequence[int], restores: int, recomputes: int) -> float:
    """The restore-vs-resident turns: three workers, each length prefilled ``recomputes``
    times and restored ``restores`` times from four places."""
    prefill = sum(rates.prefill_s(n) for n in lengths)
    return 3 * rates.worker_start_s + prefill * (recomputes + 1) + 4 * restores * len(lengths)


def no_reuse_s(rates: Rates, compare: Compare, requests: int) -> float:
    """The no-reuse pair: ``requests`` first turns on each side of one worker."""
    convs = compare.workload
    first = sum(
        rates.request_s(request_tokens(c, 0), 0, c.turns[0].answer_tokens) for c in convs
    ) / len(convs)
    return rates.worker_start_s + 2 * requests * first


Workload = tuple[Compare, Costs, Sequence[str]]
"""A workload's comparison, its predicted costs and the configurations it is played in."""


def fit(budget_s: float, fixed_s: float, workloads: dict[str, Workload]) -> dict[str, int]:
    """Measured turns per workload (played in its configurations): what is left of
    ``budget_s`` after ``fixed_s`` and the primings, split evenly between the workloads,
    within :meth:`~kvgate.bench.multiturn.compare.Compare.measured_bounds`."""
    left = budget_s * (1 - MARGIN) - fixed_s
    left -= sum(c.priming_s + c.configs_s(0, only) for _, c, only in workloads.values())
    share = left / max(1, len(workloads))
    return {name: _turns(share, workload) for name, workload in workloads.items()}


def refit(left_s: float, now: Workload, later: Sequence[Workload]) -> tuple[int, float]:
    """Measured turns for the workload ``now``, whose priming has just ended, when the
    budget has ``left_s`` seconds left for the workloads, and the seconds from now by which
    ``now`` must be done: ``now``'s configuration starts and the ``later`` workloads'
    primings and starts set aside, the rest is split evenly between ``now`` and each of
    ``later``. What the run really took so far, not what was predicted of it, decides: a
    calibration that misjudged the machine is caught here, and what it still misjudges of
    the turns themselves is caught by the deadline (the rounds stop before it)."""
    _, costs_, only = now
    starts = costs_.configs_s(0, only)
    left = left_s * (1 - MARGIN) - starts
    left -= sum(c.priming_s + c.configs_s(0, o) for _, c, o in later)
    share = left / (1 + len(later))
    return _turns(share, now), starts + share


def _turns(share_s: float, workload: Workload) -> int:
    """The measured turns ``share_s`` seconds pay for in each of ``workload``'s
    configurations, within what the comparison may take now: more than one per primed
    conversation plays their next follow-ups too (a quick run on a 2-core EPYC had used
    461 of its 900 s at one each, 5-7 turns a configuration, and its ratios moved by
    +-15% between runs)."""
    compare, costs_, only = workload
    low, high = compare.measured_bounds()
    per_turn = costs_.configs_s(1, only) - costs_.configs_s(0, only)
    return measured_requests(share_s, per_turn, low, high)
