"""Measured turns played round by round: the rotation, the rounds, and real workers playing
every configuration's turns in the order a closed loop over the histories would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from kvgate.bench.multiturn import interleave as rounds
from kvgate.bench.multiturn import noreuse, stack
from kvgate.bench.multiturn.driver import History, Plan, Target, run
from kvgate.bench.multiturn.interleave import Served, interleave, requests_per_round, rotation
from kvgate.bench.multiturn.noreuse import write_queue
from kvgate.bench.multiturn.workload import Shape, conversations
from tests.support.bench import tiny_site

SMALL = Shape(
    common_prefix=48,
    unique_prefix_mean=100,
    unique_prefix_max=160,
    user_tokens=(16, 24),
    answer_tokens=(4, 6),
    turns=(4, 4),
)


def test_each_configuration_goes_first_in_turn() -> None:
    names = ["a", "b", "c"]
    orders = [rotation(names, r) for r in range(6)]
    assert orders[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert orders[3:] == orders[:3]
    assert rotation([], 4) == []


def test_rounds_are_one_request_per_client_and_the_rest_last() -> None:
    assert requests_per_round(7, 3) == [3, 3, 1]
    assert requests_per_round(6, 2) == [2, 2, 2]
    assert requests_per_round(1, 1) == [1]
    for measured, clients in ((0, 1), (3, 0)):
        with pytest.raises(ValueError, match="at least one"):
            requests_per_round(measured, clients)


class _Clock:
    """A perf_counter that moves only when a played turn says it took its seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("deadline_in", "turn_seconds", "rounds_played"),
    [
        (100.0, [10.0], 3),  # 30 s rounds: a fourth, from 90 s, would end at 120
        (90.0, [10.0], 3),  # one that ends on the deadline is played
        (5.0, [10.0], 1),  # the first round is played whatever its length
        (1e9, [10.0], 6),  # a far deadline plays every measured turn
        # judged by the longest round so far (30 s), not the last (3 s): a sixth round,
        # from 42 s, is not begun
        (70.0, [10.0, 10.0, 10.0, 1.0], 5),
    ],
)
def test_a_deadline_stops_the_rounds_before_one_that_would_end_past_it(
    monkeypatch: pytest.MonkeyPatch,
    deadline_in: float,
    turn_seconds: list[float],
    rounds_played: int,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    # each configuration's turn in the order they play, the last one's length from then on
    turns = iter(turn_seconds + turn_seconds[-1:] * 100)

    async def played_turn(served: Served, histories: list, requests: int) -> tuple[list, float]:
        seconds = next(turns)
        clock.now += seconds
        return [served.name] * requests, seconds

    monkeypatch.setattr(rounds, "play_turn", played_turn)
    served = [Served(n, Target(f"http://{n}", cache_salt=n)) for n in ("a", "b", "c")]
    played = interleave(served, [], measured=6, clients=1, deadline=clock.now + deadline_in)
    assert {n: len(p.results) for n, p in played.items()} == dict.fromkeys("abc", rounds_played)
    assert {p.unplayed for p in played.values()} == {6 - rounds_played}


def test_real_workers_play_the_closed_loops_turns_in_rounds_and_a_dead_one_drops_out(
    tmp_path: Path, smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drained = noreuse.drained
    queue_after_turn: list[float] = []

    async def recorded_drain(url: str) -> None:  # the real wait, then what the worker says
        await drained(url)
        async with httpx.AsyncClient() as client:
            queue_after_turn.append(write_queue((await client.get(f"{url}/metrics")).text))

    monkeypatch.setattr(rounds.noreuse, "drained", recorded_drain)
    convs = conversations(3, SMALL, seed=11)
    site = tiny_site(tmp_path / "nas", smollm2_gguf, KVGATE_TIER_HOST_BYTES=str(1 << 30))
    with stack.worker("rounds", "host,nas", site, tmp_path / "logs") as url:
        primed = [History(c) for c in convs]
        first = run(Target(url, cache_salt="prime"), primed, Plan(1, 3, 0, 3), progress=False)
        assert not [r.error for r in asyncio.run(first) if r.error]
        # the order a closed loop of one client over the primed histories plays
        alone = [h.copy() for h in primed]
        expected = asyncio.run(
            run(Target(url, cache_salt="loop"), alone, Plan(1, 3, 0, 5), progress=False)
        )
        served = [
            Served("tiered", Target(url, cache_salt="tiered"), drain_urls=(url,)),
            Served("dead", Target("http://127.0.0.1:9", cache_salt="dead")),
            Served("plain", Target(url, cache_salt="plain")),
        ]
        rounds_seen: list[dict[str, tuple[int, bool]]] = []
        played = interleave(
            served,
            primed,
            measured=5,
            clients=1,
            after_round=lambda so_far: rounds_seen.append(
                {n: (len(p.results), bool(p.failure)) for n, p in so_far.items()}
            ),
        )
    order = [(r.cid, r.turn) for r in expected]
    for name in ("tiered", "plain"):
        p = played[name]
        assert p.failure == ""
        assert [(r.cid, r.turn) for r in p.results] == order
        assert not [r.error for r in p.results if r.error]
        assert sum(r.latency for r in p.results) <= p.seconds
    assert [h.next_turn for h in primed] == [1, 1, 1]  # each played a copy of its own
    assert played["dead"].failure.startswith("round 1:") and not played["dead"].results
    # the tiered configuration's turns each ended with its write-behind empty
    assert queue_after_turn == [0.0] * 5
    # each round's end saw the turns played so far, so a stopped run keeps them
    assert rounds_seen == [
        {"tiered": (k, False), "dead": (0, True), "plain": (k, False)} for k in range(1, 6)
    ]
    assert played["plain"].summary().requests == 5
