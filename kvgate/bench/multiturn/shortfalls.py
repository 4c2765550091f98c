"""Why a missed target figure missed, in words computed from the run: the bandwidth a
restore figure needed beside what its tier and the machine's floors delivered, each
no-reuse wave's cost and what writing pages alone takes, the ideal's own speedup, and for
a chat comparison the timings of the configurations it compares."""

from __future__ import annotations

import math
import statistics

from kvgate.bench.multiturn.report import (
    RESTORE_REFERENCES,
    TARGETS,
    configs_of,
    fmt_rate,
    no_reuse_ratios,
    restore_turn,
)

#: the restore figures and the tier each one measures
RESTORE_FIGURES = {"nas_vs_resident_ttft": "nas", "object_vs_resident_ttft": "object"}


def restore_shortfall(data: dict, key: str) -> str:
    """Why restore figure ``key`` missed: the bandwidth its bound needed, and the measured."""
    tier = RESTORE_FIGURES[key]
    bound = next(t.bound_for(data) for t in TARGETS if t.key == key)
    ttft, resident, moved = restore_turn(data, tier)
    allowed = (bound - 1) * resident
    got = moved / max(ttft - resident, 1e-9)
    rate_key, suffix, what = RESTORE_REFERENCES[tier]
    reference = data["figures"].get(f"{key}_{suffix}")
    rate = data.get("floors", {}).get(rate_key)
    at_best = (
        f"; {what} runs at {fmt_rate(rate)} here: a restore doing nothing else would read "
        f"{reference:.2f}"
        if reference is not None and rate
        else ""
    )
    return (
        f"{moved / 1e6:.0f} MB of KV had {allowed:.3f} s over the resident turn, "
        f"{fmt_rate(moved / allowed)}; `{tier}` delivered {fmt_rate(got)}{at_best}"
    )


def no_reuse_shortfall(data: dict) -> str:
    """Why ``no_reuse_overhead`` missed: every measured wave's own overhead, the standard
    error of their median (what the waves can resolve: an A/A pair on the 2-core EPYC,
    tiering off on both sides, gave waves from -25% to +25% and a median of -0.018 over
    ten, see ``docs/benchmarks/no_reuse_noise.md``), and what writing pages alone takes."""
    ratios = no_reuse_ratios(data)
    waves = ", ".join(f"{r:+.1%}" for r in ratios)
    share = data["figures"].get("no_reuse_write_cpu_share")
    cpu = data.get("floors", {}).get("nas_page_write_cpu_s")
    writes = (
        f"; writing a page's file alone costs {cpu * 1e3:.2f} ms of CPU here, "
        f"{share:.1%} of the tiered waves' time"
        if share is not None and cpu
        else ""
    )
    return (
        f"the measured waves cost {waves} with tiering on; the median of {len(ratios)} "
        f"such waves resolves about ±{median_error(ratios):.3f}{writes}"
    )


def median_error(samples: list[float]) -> float:
    """The standard error of the median of ``samples``: sqrt(pi/2) x their standard
    deviation / sqrt(n), the large-sample rule for a normal spread (0 for fewer than 2)."""
    if len(samples) < 2:
        return 0.0
    return math.sqrt(math.pi / 2) * statistics.stdev(samples) / math.sqrt(len(samples))


def docqa_shortfall(data: dict) -> str:
    """Why ``docqa_speedup_rps`` missed: what the ideal itself gives over recomputing."""
    bound = data["figures"].get("docqa_speedup_bound")
    if bound is None:
        return ""
    return (
        f"`infinite`, the ideal, serves {bound:.2f}x recompute's requests/s on this machine and "
        "workload (`docqa_speedup_bound`): the speedup no cache can pass here"
    )


#: the chat figures that compare configurations played minutes apart, and the tier each
#: one measures
CHAT_COMPARISONS = {
    "efficiency_rps_nas": "nas",
    "efficiency_ttft_nas": "nas",
    "efficiency_rps_object": "object",
    "speedup_share": "nas",
}
#: decode slower than this in ``recompute`` than in ``infinite`` says the machine moved
MACHINE_DRIFT = 0.03


def comparison_shortfall(data: dict, key: str) -> str:
    """Why a chat comparison missed, as the run saw it: TTFT and time per output token of
    ``infinite``, the tier and ``recompute``. Decode is the same work in all three (no tier
    touches a decode step), so a ``recompute`` that decoded slower than ``infinite`` shows
    the machine's speed moving between configurations, not a cost of the tier."""
    configs = configs_of(data, "chat")
    tier = CHAT_COMPARISONS[key]
    names = [n for n in ("infinite", tier, "recompute") if n in configs]
    if "infinite" not in names:
        return ""
    cells = "; ".join(
        f"`{n}` TTFT p50 {configs[n]['ttft_p50']:.2f} s, time per output token "
        f"{configs[n]['tpot_p50']:.3f} s"
        for n in names
    )
    ideal, other = configs["infinite"]["tpot_p50"], configs.get("recompute", {}).get("tpot_p50")
    drift = (other or 0) / ideal - 1 if ideal else 0.0
    moved = (
        f": `recompute`, which has no tiers, decoded {drift:.0%} slower than `infinite`, so "
        "the machine's speed moved between the configurations"
        if drift > MACHINE_DRIFT
        else ""
    )
    return cells + moved


def shortfall(data: dict, key: str) -> str:
    """Why target figure ``key`` (measured, missed) missed, where the run can tell."""
    if key in RESTORE_FIGURES:
        return restore_shortfall(data, key)
    if key == "no_reuse_overhead":
        return no_reuse_shortfall(data)
    if key == "docqa_speedup_rps":
        return docqa_shortfall(data)
    if key in CHAT_COMPARISONS:
        return comparison_shortfall(data, key)
    return ""
