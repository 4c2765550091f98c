"""Why a missed target figure missed, in words computed from the run: the bandwidth a
restore figure needed beside what its tier and the machine's floors delivered, each
no-reuse wave's cost and what writing pages alone takes, the ideal's own speedup, and for
a chat comparison the timings of the configurations it compares."""

from __future__ import annotations

from kvgate.bench.multiturn.report import (
    RESTORE_REFERENCES,
    TARGETS,
    configs_of,
    fmt_rate,
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
    """Why ``no_reuse_overhead`` missed: every measured wave's own overhead, and where the
    tiered worker's extra work runs."""
    on, off = (data["no_reuse"][side]["wave_seconds"][1:] for side in ("on", "off"))
    waves = ", ".join(f"{1 - f / n:+.1%}" for n, f in zip(on, off, strict=True))
    cpus = data.get("machine", {}).get("cpus")
    where = f"this machine's {cpus} cores" if cpus else "the machine's cores"
    share = data["figures"].get("no_reuse_write_cpu_share")
    cpu = data.get("floors", {}).get("nas_page_write_cpu_s")
    writes = (
        f"; writing a page's file alone costs {cpu * 1e3:.2f} ms of CPU here, "
        f"{share:.1%} of the tiered waves' time"
        if share is not None and cpu
        else ""
    )
    return (
        f"the measured waves cost {waves} with tiering on; keying, copying and writing every "
        f"request's pages runs on threads that take {where} from the engine's OpenMP team, "
        f"which waits for a preempted thread at each of a step's parallel regions{writes}"
    )


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
