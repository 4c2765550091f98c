"""The no-reuse pair of ``kvgate bench multiturn --compare``: waves, their interleaving, and
one real worker playing both sides that way (its tiers detached, then attached and drained
after each wave)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.multiturn import noreuse, shortfalls, stack
from kvgate.bench.multiturn.noreuse import Side, order, play, wave_count, waves, write_queue
from kvgate.bench.multiturn.workload import Shape, conversations
from tests.support.bench import tiny_site

FIRST_TURNS = Shape(
    common_prefix=48,
    unique_prefix_mean=120,
    unique_prefix_max=200,
    user_tokens=(20, 30),
    answer_tokens=(6, 8),
    turns=(1, 1),
)


def test_waves_are_whole_odd_in_number_and_at_least_three() -> None:
    convs = conversations(10, FIRST_TURNS, seed=1)
    cut = waves(convs[:6], 2)
    assert [len(w) for w in cut] == [2, 2, 2]
    assert [c.cid for w in cut for c in w] == [c.cid for c in convs[:6]]
    assert wave_count(10, 2) == 5
    for requests, clients in ((7, 2), (4, 2), (8, 2), (2, 2)):  # a part, too few, even
        with pytest.raises(ValueError, match="give 6, 10, 14"):
            wave_count(requests, clients)


def test_order_alternates_which_side_goes_first() -> None:
    a, b = Side("off", "http://a", False), Side("on", "http://b", True)
    played = order(5, (a, b))
    assert [(w, s.label) for w, s in played] == [
        (0, "off"), (0, "on"), (1, "on"), (1, "off"), (2, "off"), (2, "on"),
        (3, "on"), (3, "off"), (4, "off"), (4, "on"),
    ]  # fmt: skip
    # over the measured waves (all but the first) each side is first as often as second
    measured = played[2:]
    firsts = [measured[i][1].label for i in range(0, len(measured), 2)]
    assert firsts.count("off") == firsts.count("on")


def test_write_queue_is_read_from_metrics_and_its_absence_named() -> None:
    text = "# TYPE kvgate_worker_tier_write_queue_pages gauge\nkvgate_worker_tier_write_queue_pages 7.0\n"
    assert write_queue(text) == 7
    with pytest.raises(ValueError, match="no kvgate_worker_tier_write_queue_pages"):
        write_queue("# TYPE other gauge\nother 1.0\n")


def _store_events(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        s.labels["event"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "kvgate_worker_tier_store_events_total"
    }


def test_one_real_worker_plays_both_sides_and_only_its_tiered_waves_write_and_drain(
    tmp_path: Path, smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drained, set_up = noreuse.drained, noreuse._set_up
    after_drain: list[float] = []
    at_wave_start: list[tuple[str, float]] = []  # side, pages written so far

    async def recorded_drain(url: str) -> None:  # the real wait, then what the worker says
        await drained(url)
        async with httpx.AsyncClient() as client:
            after_drain.append(write_queue((await client.get(f"{url}/metrics")).text))

    async def recorded_set_up(side: Side) -> None:
        await set_up(side)
        at_wave_start.append((side.label, _store_events(side.url).get("written", 0)))

    monkeypatch.setattr(noreuse, "drained", recorded_drain)
    monkeypatch.setattr(noreuse, "_set_up", recorded_set_up)
    convs = conversations(6, FIRST_TURNS, seed=3)
    site = tiny_site(
        tmp_path / "nas", smollm2_gguf, pool_tokens=384, KVGATE_TIER_HOST_BYTES=str(1 << 30)
    )
    with stack.worker("pair", "host,nas", site, tmp_path / "logs") as url:
        out = play((Side("off", url, False), Side("on", url, True)), convs, clients=2)
        written_at_end = _store_events(url).get("written", 0)
        backend = httpx.get(f"{url}/hicache/storage-backend").json()
    for label in ("off", "on"):
        s = out[label]
        assert s["requests"] == 4 and s["errors"] == 0  # two measured waves of two
        assert len(s["wave_seconds"]) == len(s["drain_seconds"]) == 3
        assert all(0 <= d < w for d, w in zip(s["drain_seconds"], s["wave_seconds"], strict=True))
        assert s["seconds"] == pytest.approx(sum(s["wave_seconds"][1:]))
        assert s["rps"] == pytest.approx(4 / s["seconds"])
        assert s["cached_by_tier"].get("host", 0) == 0 and s["cached_by_tier"].get("nas", 0) == 0
    # pages reached the NAS during the waves with the tiers on, and only during those
    marks = [w for _, w in at_wave_start] + [written_at_end]
    for (label, _), before, after in zip(at_wave_start, marks[:-1], marks[1:], strict=True):
        assert (after > before) == (label == "on"), (label, before, after)
    # each of those waves ended once every page was written; the others waited for nothing
    assert after_drain == [0.0] * 3
    assert out["off"]["drain_seconds"] == [0.0] * 3 and min(out["on"]["drain_seconds"]) > 0
    assert backend["hicache_storage_backend"] is not None  # the last wave played attached
    assert any((tmp_path / "nas").rglob("*.kvb"))


def test_the_median_error_of_one_sample_is_zero_and_grows_with_spread() -> None:
    assert shortfalls.median_error([0.3]) == 0.0
    assert shortfalls.median_error([0.0, 0.02]) < shortfalls.median_error([0.0, 0.2])
