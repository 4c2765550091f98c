"""Every configuration's measured turns played round by round, not one configuration after
another.

On a shared 2-core VM the speed of decoding drifts by tens of percent within minutes (the
copy bandwidth read 31-53 GB/s in one run; in one no-reuse pair, adjacent waves of the
same request decoded at 0.042 and 0.060 s per token). Played one after another, each
configuration met a different machine: two quick runs of the same code gave
``efficiency_rps_nas`` 1.10 and 0.77. Played in rounds, every configuration plays the same
round-robin turn of its own copy of the primed histories within seconds of the others, the
configuration that goes first rotating from round to round, so that whatever drifts weighs
on all of them alike.

A run given a deadline plays no round that would end past it, judged by the longest round
played so far: the time budget is kept by what the rounds measure, not only by the
calibration's prediction of them (a quick run on a faster EPYC bought 9 chat turns a
configuration from a prediction 30% short, and ended at 944 of its 900 s).

A configuration's seconds are the sum of its own turns' seconds. Each turn ends only once
the write-behind of the workers that served it has written every page it was given: the
configuration pays for the background work it caused, and that work never runs during
another configuration's turn. Dirty page-cache pages are written out before each turn,
untimed, for the same reason (the kernel would write them back ~30 s later, on the cores
of whichever turn runs then).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from kvgate.bench.multiturn import noreuse
from kvgate.bench.multiturn.driver import History, Plan, Result, Target, run
from kvgate.bench.multiturn.metrics import Summary, summarize


@dataclass(frozen=True)
class Served:
    """One configuration, up and warm: where its requests go."""

    name: str
    target: Target
    headers_for: Callable[[str, int], dict[str, str]] | None = None
    #: the workers whose write-behind a turn waits for (none where nothing writes behind)
    drain_urls: tuple[str, ...] = ()


@dataclass
class Played:
    """One configuration's measured turns so far."""

    results: list[Result] = field(default_factory=list)
    #: the sum of its turns' seconds
    seconds: float = 0.0
    #: why it stopped before its last round ("" while it plays)
    failure: str = ""
    #: measured turns the deadline left unplayed
    unplayed: int = 0

    def summary(self) -> Summary:
        """Its figures, requests/s over its own turns' seconds."""
        return summarize(self.results, seconds=self.seconds)


def rotation(names: Sequence[str], round_no: int) -> list[str]:
    """``names`` in the order they play round ``round_no``: the first to play moves one on
    each round, so each configuration plays first (and after each other one) equally often."""
    k = round_no % len(names) if names else 0
    return [*names[k:], *names[:k]]


def requests_per_round(measured: int, clients: int) -> list[int]:
    """The requests of each round: one per client, the last round what is left over."""
    if measured < 1 or clients < 1:
        raise ValueError(
            f"need at least one measured turn and one client, not {measured}, {clients}"
        )
    full, rest = divmod(measured, clients)
    return [clients] * full + ([rest] if rest else [])


async def play_turn(
    served: Served, histories: list[History], requests: int
) -> tuple[list[Result], float]:
    """Play the next ``requests`` turns of ``histories`` on ``served`` at once, round-robin:
    the histories played move to the end of the list, as a closed loop over them would take
    them. Returns the results and the seconds from the first send to the last page written."""
    os.sync()  # untimed: see the module docstring
    start = time.perf_counter()
    before = [h.next_turn for h in histories]
    plan = Plan(clients=requests, active=len(histories), warmup=0, max_requests=requests)
    results = await run(
        served.target, histories, plan, headers_for=served.headers_for, progress=False
    )
    for url in served.drain_urls:
        await noreuse.drained(url)
    seconds = time.perf_counter() - start
    waiting = [h for h, b in zip(histories, before, strict=True) if h.next_turn == b]
    histories[:] = waiting + [h for h in histories if h not in waiting]
    return results, seconds


def interleave(
    served: Sequence[Served],
    primed: Sequence[History],
    measured: int,
    clients: int,
    after_round: Callable[[dict[str, Played]], None] = lambda played: None,
    deadline: float | None = None,
) -> dict[str, Played]:
    """Play ``measured`` turns per configuration of ``served``, each on its own copy of
    ``primed``, in rounds of ``clients`` requests (see the module docstring). A
    configuration whose turn fails to complete (its server gone, its write-behind stuck)
    keeps what it measured, records why, and sits out the rounds after. ``after_round`` is
    given what every configuration has played so far at the end of each round, so a run
    stopped mid-way still has the rounds it finished. With a ``deadline`` (a
    :func:`time.perf_counter` reading), the rounds stop before one that the longest round
    so far says would end past it; the first round is always played."""
    played = {s.name: Played() for s in served}
    histories = {s.name: [h.copy() for h in primed] for s in served}
    by_name = {s.name: s for s in served}
    longest = 0.0
    per_round = requests_per_round(measured, clients)
    for round_no, requests in enumerate(per_round):
        started = time.perf_counter()
        if round_no and deadline is not None and started + longest > deadline:
            for p in played.values():
                p.unplayed = 0 if p.failure else sum(per_round[round_no:])
            break
        for name in rotation([s.name for s in served], round_no):
            if played[name].failure:
                continue
            try:
                results, seconds = asyncio.run(play_turn(by_name[name], histories[name], requests))
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                played[name].failure = f"round {round_no + 1}: {exc}"
                continue
            played[name].results += results
            played[name].seconds += seconds
        after_round(played)
        longest = max(longest, time.perf_counter() - started)
    return played
