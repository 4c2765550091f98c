"""``kvgate bench multiturn``: the workload's determinism and shape, the driver against a real
worker, the statistics and the JSON figures. Speed itself is measured by the benchmark."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from gateway.router import Router
from kvgate.bench.multiturn import budget, sizing, stack
from kvgate.bench.multiturn.command import multiturn
from kvgate.bench.multiturn.compare import CONFIGS, Compare, alternating_sessions, warm_up
from kvgate.bench.multiturn.docs import findings, render
from kvgate.bench.multiturn.driver import History, Plan, Result, Target, model_of, run, send
from kvgate.bench.multiturn.environment import machine
from kvgate.bench.multiturn.metrics import percentile, summarize
from kvgate.bench.multiturn.report import TARGETS, markdown_table, physics, verdicts
from kvgate.bench.multiturn.specs import QUICK, spec_dict
from kvgate.bench.multiturn.workload import (
    WORDS,
    WORKLOADS,
    Shape,
    conversations,
    single_history,
    words,
)
from protocol.registry import WorkerInfo
from tests.support.bench import recorded_run, tiny_site
from workers.engine.tokenizer import load_tokenizer

SMALL = Shape(
    common_prefix=64,
    unique_prefix_mean=100,
    unique_prefix_max=200,
    user_tokens=(20, 30),
    answer_tokens=(8, 12),
    turns=(3, 4),
)


# --- workload ---------------------------------------------------------------------------------
def test_same_seed_same_workload_other_seed_other_workload() -> None:
    assert conversations(5, seed=3) == conversations(5, seed=3)
    assert conversations(5, seed=3) != conversations(5, seed=4)


def test_default_shape_is_the_published_one() -> None:
    convs = conversations(400)
    system = convs[0].system
    assert len(system.split()) == 500
    assert all(c.system == system for c in convs)  # one common prefix
    assert {len(c.turns) for c in convs} <= set(range(6, 10))
    assert {len(c.turns) for c in convs} == set(range(6, 10))
    for c in convs:
        assert 1 <= c.unique_tokens <= 3000
        doc, _, first_message = c.turns[0].user.partition("\n\n")
        assert len(doc.split()) == c.unique_tokens
        assert 120 <= len(first_message.split()) <= 160
        for turn in c.turns:
            assert 80 <= turn.answer_tokens <= 120
        for turn in c.turns[1:]:
            assert 120 <= len(turn.user.split()) <= 160
    # lognormal with mean 1,000 (clipping at 3,000 pulls it down a little)
    assert 900 <= statistics.mean(c.unique_tokens for c in convs) <= 1100
    assert len({c.turns[0].user for c in convs}) == 400  # unique first turns


def test_docqa_is_long_documents_then_short_questions_with_short_answers() -> None:
    convs = conversations(200, WORKLOADS["docqa"])
    assert {len(c.turns) for c in convs} == set(range(6, 11))
    for c in convs:
        assert 3000 <= c.unique_tokens <= 6000
        assert all(50 <= len(t.user.split()) <= 100 for t in c.turns[1:])
        assert all(1 <= t.answer_tokens <= 8 for t in c.turns)
    assert WORKLOADS["chat"] == Shape()


def test_pools_hold_the_concurrent_requests_and_the_idle_histories_are_many_pools() -> None:
    convs = conversations(64, WORKLOADS["chat"])
    k = sizing.primed(convs, 2, 1, 3.0)
    pool = sizing.pool_tokens(convs[:k], 2, range(1, 2))
    largest = max(sizing.request_tokens(c, 1) for c in convs[:k])
    assert pool >= 2 * largest and pool % 16 == 0
    idle = sorted(c.tokens(1) for c in convs[:k])[:-2]
    assert sum(idle) >= 3 * pool  # the histories waiting for their turn: 3x the pool
    shorter = sorted(c.tokens(1) for c in convs[: k - 1])[:-2]
    assert sum(shorter) < 3 * sizing.pool_tokens(convs[: k - 1], 2, range(1, 2))  # the fewest
    with pytest.raises(ValueError, match="cannot make"):
        sizing.primed(convs[:4], 2, 1, 3.0)


def test_a_budget_buys_the_turns_it_can_pay_for_within_bounds() -> None:
    rates = sizing.Rates(0.002, 1e-7, 0.2, 2, 10.0)
    assert rates.prefill_s(1000, 0) == pytest.approx(2.0 + 0.1)
    assert rates.prefill_s(1000, 1000) == pytest.approx(2.0 + 0.3)  # attention over the cache
    assert rates.request_s(1100, 1000, 100) == pytest.approx(rates.prefill_s(100, 1000) + 10.0)
    # each step also reads the request's context: 1100 prompt tokens + half the answer
    reading = sizing.Rates(0.002, 1e-7, 0.2, 2, 10.0, decode_per_context_s=1e-5)
    assert reading.request_s(1100, 1000, 100) == pytest.approx(
        rates.request_s(1100, 1000, 100) + 100 * 1e-5 * 1150
    )
    assert sizing.measured_requests(100.0, 9.0, 2, 20) == 11
    assert sizing.measured_requests(10.0, 9.0, 2, 20) == 2
    assert sizing.measured_requests(1e6, 9.0, 2, 20) == 20


def test_the_prefill_fit_recovers_its_model_and_weighs_the_long_prompt() -> None:
    model = sizing.Rates(0.0016, 1e-7, 0.04, 1, 10.0)
    a, b = sizing.fit_prefill([(n, model.prefill_s(n)) for n in sizing.CALIBRATION_PROMPTS])
    assert (a, b) == (pytest.approx(0.0016), pytest.approx(1e-7))
    # short prompts alike, the long one slower: a line through the first two alone (b = 0)
    # would put a 5k-token prefill at 8 s; the fit through all three puts it past 9
    points = [(384, 384 * 0.0016), (1536, 1536 * 0.0016), (4096, 4096 * 0.002)]
    a, b = sizing.fit_prefill(points)
    assert b > 0 and sizing.Rates(a, b, 0.04, 1, 10.0).prefill_s(5000) > 9.0
    # per-token time that falls with length (noise) never makes tokens cheaper
    mean = (0.8 / 384 + 6.0 / 4096) / 2
    assert sizing.fit_prefill([(384, 0.8), (4096, 6.0)]) == (pytest.approx(mean), 0.0)


def test_a_budget_buys_second_follow_ups_until_priming_fixes_the_pool(tmp_path: Path) -> None:
    """A budget with room plays a second follow-up of some conversations (the quick run
    had used half its budget at one each); once primed, the pool sized for that turn
    is kept: a refit stays within it, however much or little time is left."""
    spec = QUICK.workloads[0]
    compare = Compare(None, spec, 1, tmp_path)  # type: ignore[arg-type]  # sizes only
    n, pool_one = len(compare.workload), compare.pool_tokens
    follow_ups = min(len(c.turns) - 1 for c in compare.workload)
    assert compare.measured_bounds() == (spec.clients, n * follow_ups)
    costs = budget.Costs(0.0, dict.fromkeys(CONFIGS, 0.0), dict.fromkeys(CONFIGS, 1.0))
    only = ("nas",)  # one configuration, one second a turn: the budget buys its seconds
    turns = budget.fit((n + 3.5) / (1 - budget.MARGIN), 0.0, {"chat": (compare, costs, only)})
    assert turns == {"chat": n + 3}
    compare.resize(turns["chat"])
    assert compare.pool_tokens > pool_one  # it holds the second follow-ups' requests
    compare.primed = [History(c) for c in compare.workload]
    assert compare.measured_bounds() == (n + 1, 2 * n)
    assert budget.refit(1e6, (compare, costs, only), [])[0] == 2 * n
    assert budget.refit(0.0, (compare, costs, only), [])[0] == n + 1
    plain = Compare(None, spec, 1, tmp_path)  # type: ignore[arg-type]
    plain.resize(n)
    plain.primed = [History(c) for c in plain.workload]
    assert plain.measured_bounds() == (spec.clients, n)


def test_a_refit_gives_the_workload_its_share_and_a_deadline_that_leaves_the_next_its_own(
    tmp_path: Path,
) -> None:
    """100 s left, 10% kept back: the later workload's priming (10 s) and start (2 s) set
    aside, the 76 s left split in two; the workload now may take its own start and half."""
    compare = Compare(None, QUICK.workloads[0], 1, tmp_path)  # type: ignore[arg-type]
    compare.primed = [History(c) for c in compare.workload]
    costs = budget.Costs(10.0, dict.fromkeys(CONFIGS, 2.0), dict.fromkeys(CONFIGS, 1.0))
    now, later = (compare, costs, ("nas",)), (compare, costs, ("nas",))
    _, seconds = budget.refit(100.0, now, [later])
    assert seconds == pytest.approx(2.0 + (90.0 - 2.0 - 12.0) / 2)
    assert budget.refit(100.0, now, [])[1] == pytest.approx(90.0)  # the last takes the rest


def test_every_word_is_one_smollm2_token(smollm2_gguf: Path) -> None:
    tokenizer = load_tokenizer(smollm2_gguf)
    long = [w for w in WORDS if len(tokenizer.encode(" " + w, add_special_tokens=False)) != 1]
    assert long == []
    text = conversations(1, seed=9)[0].turns[1].user
    assert len(tokenizer.encode(text, add_special_tokens=False)) == len(text.split())


def test_single_history_has_the_asked_length() -> None:
    conv = single_history(4000, seed=1)
    history, follow = conv.turns
    assert len(conv.system.split()) + len(history.user.split()) == 4000
    assert len(follow.user.split()) == 120
    assert single_history(4000, seed=2).system != conv.system  # no page shared across seeds


# --- statistics and figures -------------------------------------------------------------------
def _result(turn: int, start: float, ttft: float, latency: float, **kw: object) -> Result:
    r = Result("c", turn, start, ttft=ttft, latency=latency, **kw)  # type: ignore[arg-type]
    return r


def test_percentile_interpolates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


def test_summary_leaves_out_warmup_and_counts_errors() -> None:
    results = [
        _result(0, 0.0, 5.0, 9.0, prompt_tokens=100, output_tokens=10, warmup=True),
        _result(1, 10.0, 1.0, 3.0, prompt_tokens=200, cached_tokens=150, output_tokens=11),
        _result(2, 11.0, 2.0, 4.0, prompt_tokens=300, cached_tokens=250, output_tokens=11,
                cached_by_tier={"nas": 200, "device": 50}),
        _result(0, 12.0, 0.0, 1.0, error="HTTP 500"),
    ]  # fmt: skip
    s = summarize(results)
    assert (s.requests, s.errors) == (2, 1)
    assert s.seconds == pytest.approx(5.0)  # 10.0 .. 15.0
    assert s.rps == pytest.approx(0.4)
    assert s.output_tps == pytest.approx(22 / 5)
    assert s.ttft_p50 == pytest.approx(1.5)
    assert s.cached_ratio == pytest.approx(400 / 500)
    assert s.followup_cached_ratio == pytest.approx(400 / 500)
    assert s.cached_by_tier == {"nas": 200, "device": 50}
    assert results[1].tpot == pytest.approx(0.2)


def test_verdicts_compute_each_target_figure_from_the_run() -> None:
    data = recorded_run()
    v = verdicts(data)
    assert set(v) == {
        "efficiency_rps_nas", "efficiency_ttft_nas", "efficiency_rps_object", "speedup_share",
        "docqa_speedup_rps", "nas_vs_resident_ttft", "object_vs_resident_ttft",
        "no_reuse_overhead", "cross_worker_cached_ratio", "wall_s",
    }  # fmt: skip
    assert v["efficiency_rps_nas"]["value"] == pytest.approx(1 / 1.05)
    assert v["efficiency_ttft_nas"]["value"] == pytest.approx(0.9)
    assert v["efficiency_rps_object"]["value"] == pytest.approx(0.95 / 1.05)
    assert v["speedup_share"]["value"] == pytest.approx((10 - 1) / (10.5 - 1))
    assert v["docqa_speedup_rps"]["value"] == pytest.approx(19.0)
    assert v["nas_vs_resident_ttft"]["value"] == pytest.approx(1.05)
    assert v["object_vs_resident_ttft"]["value"] == pytest.approx(4.5)
    assert v["no_reuse_overhead"]["value"] == pytest.approx(0.005)
    assert v["cross_worker_cached_ratio"]["value"] == pytest.approx(0.95)
    met = {k: x["met"] for k, x in v.items()}
    assert met == {k: k != "object_vs_resident_ttft" for k in met}
    assert all({"value", "target", "meaning"} <= set(x) for x in v.values())
    f = data["figures"]  # the figures without targets, beside them
    assert f["speedup_rps"] == pytest.approx(10.0) and f["speedup_bound"] == pytest.approx(10.5)
    assert f["efficiency_rps_host"] == pytest.approx(1 / 1.05)
    assert f["docqa_ttft_speedup_p50"] == pytest.approx(1.0)
    # the full run aims higher
    full = verdicts(recorded_run(run="full"))
    assert full["efficiency_rps_nas"]["target"] == ">= 0.95"
    assert full["docqa_speedup_rps"]["met"] is False


def test_no_reuse_overhead_is_the_median_of_paired_waves_not_moved_by_one_stall() -> None:
    # wave 2 stalled on the untiered side: summed seconds would say tiering is 30% faster
    pair = {
        "on": {"wave_seconds": [99.0, 10.0, 10.0, 10.0, 10.0, 10.0]},
        "off": {"wave_seconds": [1.0, 9.95, 25.0, 9.9, 9.95, 9.7]},
    }
    v = verdicts(recorded_run(no_reuse=pair))["no_reuse_overhead"]
    assert v["value"] == pytest.approx(0.005)  # the median of 0.005, -1.5, 0.01, 0.005, 0.03
    assert v["met"] is True
    lines = findings({"spec": {}, "no_reuse": pair})
    assert "- No reuse, seconds per wave (warm-up first): off 1.0, 9.9, 25.0" in lines[0]
    assert "write-behind" not in lines[0]  # a run from before drains were timed
    pair["on"]["drain_seconds"] = [0.5, 0.25, 0.125, 0, 0, 0]
    (line,) = findings({"spec": {}, "no_reuse": pair})
    assert line.endswith("once the requests had ended: 0.50, 0.25, 0.12, 0.00, 0.00, 0.00.")


def test_a_missed_restore_figure_names_the_bandwidth_it_needed_and_the_one_measured() -> None:
    data = recorded_run(spec={})
    data["targets"] = verdicts(data)
    (line,) = [x for x in findings(data) if "object_vs_resident_ttft" in x]
    # 4096 tokens x 46080 B = 189 MB; <= 1.4 allows 0.4 x 0.2 s; it took 0.9 - 0.2 s
    assert line == (
        "- `object_vs_resident_ttft` missed: 4.500 against <= 1.4 (189 MB of KV had 0.080 s "
        "over the resident turn, 2.36 GB/s; `object` delivered 269.63 MB/s)."
    )


def test_a_missed_no_reuse_figure_lists_each_waves_cost_and_what_their_median_resolves() -> None:
    pair = {
        "on": {"wave_seconds": [40.0, 10.5, 20.0, 31.5]},
        "off": {"wave_seconds": [39.0, 10.0, 20.2, 30.0]},
    }
    data = recorded_run(spec={}, no_reuse=pair, machine={"cpus": 2})
    data["targets"] = verdicts(data)
    (line,) = [x for x in findings(data) if "`no_reuse_overhead`" in x]
    assert line.startswith(
        "- `no_reuse_overhead` missed: 0.048 against <= 0.01 (the measured waves cost "
        "+4.8%, -1.0%, +4.8% with tiering on; the median of 3 such waves resolves about "
        "±0.024"  # sqrt(pi/2) x their standard deviation (0.033) / sqrt(3)
    )


def test_a_figure_that_was_not_measured_is_missed_with_a_reason() -> None:
    v = verdicts(recorded_run(workloads={}))
    assert v["efficiency_rps_nas"]["value"] is None
    assert v["efficiency_rps_nas"]["met"] is False
    assert "not measured" in v["efficiency_rps_nas"]["why"]
    assert len(TARGETS) == 10


def test_physics_and_table_come_from_the_samples() -> None:
    data = recorded_run()
    phys = physics(data)
    assert phys["prefill_tokens_per_s"]["4000"] == pytest.approx(4100 / 8.2)
    assert phys["restore_bytes_per_s"]["nas"]["4000"] == pytest.approx(4096 * 46080 / 0.01)
    assert phys["break_even_bytes_per_s"] == pytest.approx(4100 / 8.2 * 46080)
    pred = phys["rtx4090_prediction"]["Llama-3.1-8B"]
    assert pred["speedup_100 GbE"] > pred["speedup_25 GbE"] > 0
    data["targets"] = verdicts(data)
    table = markdown_table(data)
    assert "| nas | 1.000 |" in table and "| `speedup_rps` | 10.000 |" in table
    assert "**docqa**" in table


# --- routing ----------------------------------------------------------------------------------
def test_alternating_sessions_send_each_turn_to_the_other_worker() -> None:
    ids = ("bench-a", "bench-b")
    headers_for = alternating_sessions("m", ids)
    router = Router(load_factor=1.25)
    router.update([WorkerInfo(w, f"http://{w}", "m", 64, 0) for w in ids])
    owners = []
    for turn in range(6):
        session = headers_for("conv-1", turn)["x-session-id"]
        chosen = router.choose("m", "h:" + session, lambda _: True)
        assert chosen is not None
        owners.append(chosen.worker_id)
    assert owners == ["bench-a", "bench-b"] * 3


# --- the driver against a real worker -----------------------------------------------------------
def test_driver_plays_every_turn_with_real_answers_round_robin(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    # an L1 of 640 tokens: it must evict
    site = tiny_site(tmp_path, smollm2_gguf, pool_tokens=640, KVGATE_TIER_HOST_BYTES=str(1 << 30))
    convs = conversations(6, SMALL, seed=5)
    with stack.worker("tiny", "host", site, tmp_path / "logs") as url:
        results = asyncio.run(
            run(Target(url), convs, Plan(clients=2, active=4, warmup=2), progress=False)
        )
    assert not [r.error for r in results if r.error]
    assert len(results) == sum(len(c.turns) for c in convs)
    by_conv: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        by_conv.setdefault(r.cid, []).append(i)
    for c in convs:
        turns = [results[i] for i in by_conv[c.cid]]
        assert [r.turn for r in turns] == list(range(len(c.turns)))
        for turn, r in zip(c.turns, turns, strict=True):
            assert r.output_tokens == turn.answer_tokens  # min_tokens = max_tokens held
            assert 0 < r.ttft <= r.latency
        for prev, nxt, turn in zip(turns, turns[1:], c.turns[1:], strict=False):
            # the whole history is resent: the earlier prompt, the real answer, the new message
            assert nxt.prompt_tokens >= prev.prompt_tokens + prev.output_tokens + len(
                turn.user.split()
            )
    # Round-robin over more conversations than clients: while at least clients + 1
    # conversations still have turns to play, another one's turn always comes in between.
    cutoff = sorted(p[-1] for p in by_conv.values())[-3]
    for positions in by_conv.values():
        assert all(b - a >= 2 for a, b in itertools.pairwise(positions) if b <= cutoff)
    assert sum(r.warmup for r in results) == 2
    followups = [r for r in results if r.turn > 0]
    assert sum(r.cached_by_tier.get("host", 0) for r in followups) > 0  # evicted, then restored
    assert summarize(results).requests == len(results) - 2


def test_warm_up_runs_a_prompt_in_a_namespace_no_measured_turn_shares(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    site = tiny_site(tmp_path, smollm2_gguf)
    target = Target("", cache_salt="bench-chat-0")

    async def ask(url: str, salt: str, messages: list[dict[str, str]]) -> Result:
        result = Result("probe", 0, 0.0)
        async with httpx.AsyncClient(timeout=60) as client:
            model = await model_of(client, Target(url))
            await send(client, Target(url, cache_salt=salt), model, messages, 1, result)
        assert not result.error
        return result

    text = words(random.Random(3), 64)  # what warm_up(seed=3) sends
    messages = [{"role": "user", "content": text}]
    with stack.worker("tiny", "", site, tmp_path / "logs") as url:
        asyncio.run(warm_up(replace(target, url=url), None, 64, seed=3))
        # the warm-up's KV is there, in its own namespace only
        assert asyncio.run(ask(url, "bench-chat-0-warm-up", messages)).cached_tokens >= 48
        assert asyncio.run(ask(url, "bench-chat-0", messages)).cached_tokens == 0


def test_histories_go_on_from_where_they_were_and_copies_go_on_alike(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    site = tiny_site(tmp_path, smollm2_gguf)
    primed = [History(c) for c in conversations(2, SMALL, seed=7)]
    with stack.worker("tiny", "", site, tmp_path / "logs") as url:
        salted = Target(url, cache_salt="tenant-a")
        first = asyncio.run(run(salted, primed, Plan(2, 2, 0, 2), progress=False))
        assert [(r.turn, r.error) for r in first] == [(0, ""), (0, "")]
        assert [h.next_turn for h in primed] == [1, 1]
        played = {r.cid: r.prompt_tokens + r.output_tokens for r in first}
        assert {h.conv.cid: h.kv_tokens for h in primed} == played
        copies = [[h.copy() for h in primed] for _ in range(2)]
        plays = [asyncio.run(run(salted, c, Plan(1, 2, 0, 2), progress=False)) for c in copies]
        other = Target(url, cache_salt="tenant-b")  # another namespace: nothing of a's
        alone = asyncio.run(
            run(other, [h.copy() for h in primed], Plan(1, 2, 0, 2), progress=False)
        )
    for results in plays:  # each copy played the second turn, on the same history
        assert sorted((r.cid, r.turn) for r in results) == sorted((h.conv.cid, 1) for h in primed)
        assert {r.cid: r.prompt_tokens for r in results} == {
            r.cid: r.prompt_tokens for r in plays[0]
        }
    assert [h.next_turn for h in primed] == [1, 1]  # the originals stayed where they were
    held = {h.conv.cid: h.kv_tokens for h in primed}
    assert all(r.prompt_tokens > held[r.cid] for r in plays[0])  # history, then the message
    # the salt reached the worker: its history was found under it, and only under it
    assert all(r.cached_tokens >= held[r.cid] // 2 for r in plays[0])
    assert alone[0].cached_tokens == 0  # b's second turn finds b's system prompt, no more
    assert max(r.cached_tokens for r in alone) < min(held.values()) // 2


def test_cli_drives_a_url_and_writes_json(tmp_path: Path, smollm2_gguf: Path) -> None:
    site = tiny_site(tmp_path, smollm2_gguf)
    out = tmp_path / "run.json"
    with stack.worker("tiny", "", site, tmp_path / "logs") as url:
        result = CliRunner().invoke(
            multiturn,
            ["--url", url, "--conversations", "3", "--active", "3", "--clients", "2",
             "--warmup", "1", "--common-prefix", "32", "--unique-mean", "50", "--unique-max",
             "80", "--user-tokens", "10", "12", "--answer-tokens", "4", "6", "--turns", "2", "2",
             "--json", str(out)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 5 and data["errors"] == 0
    for key in ("rps", "output_tps", "ttft_p50", "ttft_p90", "ttft_p99", "cached_ratio"):
        assert data[key] >= 0
    assert data["rps"] > 0


def test_quick_spec_plays_both_named_workloads_and_the_4k_restore() -> None:
    assert [(w.workload, w.shape) for w in QUICK.workloads] == [
        ("chat", WORKLOADS["chat"]),
        ("docqa", WORKLOADS["docqa"]),
    ]
    assert all(w.idle_over_pool >= 1 for w in QUICK.workloads)
    assert QUICK.workloads[0].idle_over_pool >= 3  # chat: idle histories 3x the pool
    assert 4000 in QUICK.restore_lengths and QUICK.budget_s <= 900


def _run_data() -> dict:
    data = recorded_run()
    for w in data["workloads"].values():
        w.update(conversations=13, clients=2, measured_turns=8, pool_tokens=5136,
                 working_set_tokens=20000, idle_tokens=16000, idle_over_pool=3.1,
                 first_turns=summarize([]).as_dict())  # fmt: skip
    data.update(
        run="full", seconds=600.0, spec=spec_dict(QUICK, list(QUICK.workloads)),
        budget={"budget_s": 900, "predicted_s": {"chat": 400.0, "docqa": 300.0}},
        machine=machine(), calibration={"decode_step_s": 0.2, "clients": 2},
        plots=["benchmarks/multiturn_chat.png", "benchmarks/multiturn_docqa.png"],
    )  # fmt: skip
    return data


def test_docs_explain_method_machine_results_and_physics() -> None:
    data = _run_data()
    data["targets"] = verdicts(data)
    data["physics"] = physics(data)
    text = render(data)
    for heading in ("## Method", "## Machine", "## Reproduce", "## Results", "## Physics"):
        assert heading in text
    assert "46080 bytes" in text and "3.1x the pool" in text
    assert "Llama-3.1-70B" in text and "100 GbE" in text
    # it opens with one plot per workload, each with what it means
    lead = text.split("## Method")[0]
    assert "![chat](benchmarks/multiturn_chat.png)" in lead
    assert "![docqa](benchmarks/multiturn_docqa.png)" in lead
    assert "of the 1.050 it serves when the device holds everything" in lead
    assert "sized to end within 900 s (predicted 700 s, took 600 s)" in text
    # where the figures come from: the CPU model (figures move several-fold between CPUs of
    # one architecture) and, for runs that recorded it, the code measured
    assert f"{machine()['cpu']} (" in text and "on commit" not in text
    data["commit"] = "0123456789ab-dirty"
    assert "minutes, on commit `0123456789ab-dirty`;" in render(data)


def test_report_from_a_saved_run_writes_json_table_plots_and_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(_run_data()))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(multiturn, ["--report-from", str(saved), "--json", "out.json"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out.json").read_text())
    for target in TARGETS:
        assert {"value", "target", "met"} <= set(data[target.key])
    assert data["figures"]["speedup_rps"] == pytest.approx(10.0)
    bench = tmp_path / "docs" / "benchmarks"
    assert json.loads((bench / "multiturn.json").read_text())["efficiency_rps_nas"]["met"]
    table = (bench / "multiturn.md").read_text()
    assert "| recompute |" in table
    assert table.startswith("Full run of `kvgate bench multiturn --compare` (10.0 minutes) on ")
    assert (bench / "multiturn_chat.png").stat().st_size > 0
    assert (bench / "multiturn_docqa.png").stat().st_size > 0
    assert (bench / "multiturn_restore.png").stat().st_size > 0
    assert "## What limits the figures" in (tmp_path / "docs" / "benchmarks.md").read_text()


def test_only_the_full_or_else_the_quick_run_writes_the_benchmarks_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = _run_data() | {"run": "quick"}
    saved = tmp_path / "quick.json"
    saved.write_text(json.dumps(quick))
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "docs" / "benchmarks.md"

    def report(*extra: str) -> None:
        result = CliRunner().invoke(multiturn, ["--report-from", str(saved), *extra])
        assert result.exit_code == 0, result.output

    report("--name", "experiment")  # a named side run: its own files, not the page
    assert (tmp_path / "docs" / "benchmarks" / "experiment.json").exists()
    assert not page.exists()
    report()  # the quick run stands in while no full run is recorded
    assert "(quick run" in page.read_text()
    saved.write_text(json.dumps(_run_data()))
    report()  # the full run replaces it
    saved.write_text(json.dumps(quick))
    report()  # and a later quick run leaves the full run's page alone
    assert "(full run" in page.read_text()
    # a full run recorded before runs were measured against infinite memory does not stand
    (tmp_path / "docs" / "benchmarks" / "multiturn.json").write_text('{"run": "full"}')
    report()
    assert "(quick run" in page.read_text()
