"""The sizes of a ``--compare`` run: the quick one (15 minutes on 2 cores) and the full one."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvgate.bench.multiturn import restore as restore_pair
from kvgate.bench.multiturn.compare import CONFIGS, Spec
from kvgate.bench.multiturn.workload import WORKLOADS


@dataclass(frozen=True)
class RunSpec:
    """A whole comparison: its workloads, the restore turns, the no-reuse pair, the budget."""

    workloads: tuple[Spec, ...]
    restore_lengths: tuple[int, ...]
    restore_repeats: restore_pair.Repeats
    #: first turns of fresh chat conversations per side, in waves of ``no_reuse_clients``
    no_reuse_requests: int
    no_reuse_clients: int
    #: seconds the whole run may take (0: no budget, every spec's ``measured`` as given)
    budget_s: float


def _chat(**kw: Any) -> Spec:
    return Spec(workload="chat", shape=WORKLOADS["chat"], **kw)


def _docqa(**kw: Any) -> Spec:
    return Spec(workload="docqa", shape=WORKLOADS["docqa"], **kw)


#: The quick run: 15 minutes on a 2-core machine of 70 GFLOP/s, where one chat answer is
#: ten seconds of decoding and a docqa document a minute of prefill. One client per
#: workload (priming costs what the pool holds, and the pool holds what the clients need);
#: chat's idle histories add up to 3x the pool, docqa's documents to 1.5x (more than the
#: pool holds: a 4k document each is what makes the run minutes long); docqa leaves the
#: cross-worker check to chat. The measured turns are what the budget leaves.
QUICK = RunSpec(
    workloads=(
        _chat(clients=1, conversations=64, idle_over_pool=3, measured=8,
              small_l2_tokens=1024, small_nas_tokens=4096),
        _docqa(clients=1, conversations=32, idle_over_pool=1.5, measured=4,
               small_l2_tokens=1024, small_nas_tokens=4096,
               configs=tuple(c for c in CONFIGS if c != "gateway_shared")),
    ),
    restore_lengths=(4000,), restore_repeats=restore_pair.Repeats(restore=11, recompute=1),
    no_reuse_requests=5, no_reuse_clients=1, budget_s=900,
)  # fmt: skip
#: The full run: idle conversations 8x the pool, 8 chat clients, every conversation played
#: one measured turn; about an hour and more on 2 CPU cores.
FULL = RunSpec(
    workloads=(
        _chat(clients=8, conversations=200, idle_over_pool=8, measured=10_000,
              small_l2_tokens=2048, small_nas_tokens=8192),
        _docqa(clients=2, conversations=100, idle_over_pool=8, measured=10_000,
               small_l2_tokens=2048, small_nas_tokens=8192),
    ),
    restore_lengths=(1000, 4000, 7000), restore_repeats=restore_pair.Repeats(),
    no_reuse_requests=56, no_reuse_clients=8, budget_s=0,
)  # fmt: skip


def spec_dict(spec: RunSpec, specs: list[Spec]) -> dict[str, Any]:
    """``spec`` for JSON, with the workloads played (``specs``) by name."""
    out = asdict(spec)
    out["workloads"] = {s.workload: asdict(s) for s in specs}
    return out
