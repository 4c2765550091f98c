"""The figures of a multi-turn comparison: targets with verdicts, physics, table, plots.

Every figure is computed from what the run measured. The only inputs that are not
measured here are the published properties of hardware this machine does not have (an RTX
4090's tensor throughput, Ethernet line rates), used solely for the labelled prediction.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: RTX 4090 dense FP16 tensor throughput (NVIDIA Ada whitepaper), and the share of it a
#: good prefill kernel sustains; used only for the labelled 4090 prediction.
RTX4090_FLOPS = 165e12
PREFILL_MFU = 0.5
#: models the prediction covers: parameters and KV bytes per token (bf16)
PREDICTED_MODELS = {"Llama-3.1-8B": (8.0e9, 128 << 10), "Llama-3.1-70B": (70.6e9, 320 << 10)}
#: NAS links: line rate in bytes/s and the share a tuned NFS client gets
NAS_LINKS = {"25 GbE": 25e9 / 8, "100 GbE": 100e9 / 8}
LINK_EFFICIENCY = 0.8
RESTORE_HISTORY = 4000


@dataclass(frozen=True)
class Target:
    """One target figure (computed by :func:`figures`) and what it must reach; a full run
    may aim higher (``full_bound``)."""

    key: str
    meaning: str
    op: str
    bound: float
    full_bound: float | None = None

    def bound_for(self, data: dict) -> float:
        """The bound of this run: the full run's where it has one of its own."""
        full = data.get("run") == "full" and self.full_bound is not None
        return self.full_bound if full else self.bound  # type: ignore[return-value]

    def verdict(self, data: dict) -> dict[str, Any]:
        value = data["figures"].get(self.key)
        why = "" if value is not None else f"not measured: {data['figures_why'].get(self.key, '')}"
        bound = self.bound_for(data)
        met = value is not None and (value >= bound if self.op == ">=" else value <= bound)
        return {"value": value, "target": f"{self.op} {bound:g}", "met": met,
                "meaning": self.meaning, **({"why": why.rstrip(": ")} if why else {})}  # fmt: skip


def configs_of(d: dict, workload: str) -> dict[str, dict]:
    """The configurations' summaries of ``workload`` (a run recorded before workloads were
    named has the chat ones only, at the top)."""
    if "workloads" in d:
        return d["workloads"].get(workload, {}).get("configs", {})
    return d.get("configs", {}) if workload == "chat" else {}


def no_reuse_ratios(d: dict) -> list[float]:
    """Each measured no-reuse wave's own ``1 - off seconds / on seconds`` (warm-up left out)."""
    on, off = (d["no_reuse"][side]["wave_seconds"][1:] for side in ("on", "off"))
    return [1 - f / n for n, f in zip(on, off, strict=True)]


def _no_reuse_overhead(d: dict) -> float:
    """1 - requests/s on / off as the median of :func:`no_reuse_ratios`: a wave plays the
    same requests on both sides, so one wave stalled by the machine (51 s against 27-36 s
    for the others, seen here) moves a sum of seconds by a tenth but leaves this median
    where the other waves put it."""
    return statistics.median(no_reuse_ratios(d))


def restore_turn(d: dict, source: str) -> tuple[float, float, int]:
    """The restore turn's TTFT from ``source``, its resident TTFT beside it, and the bytes
    of KV ``source`` served in it."""
    samples = d["restore"][str(RESTORE_HISTORY)]
    sample = samples[source]
    moved = sample["cached_by_tier"].get(source, 0) * d["kv_bytes_per_token"]
    return sample["ttft"], resident_of(samples, source)["ttft"], moved


def _restore(d: dict, source: str) -> float:
    ttft, resident, _ = restore_turn(d, source)
    return ttft / resident


def resident_of(samples: dict[str, dict], source: str) -> dict:
    """The resident sample ``source`` is compared with: asked on the same worker between its
    restores where the run did so (``resident_<source>``), else the first worker's."""
    return samples.get(f"resident_{source}", samples["resident"])


#: per restore figure: the rate of :mod:`~kvgate.bench.multiturn.floors` its tier is set
#: against, the suffix of the figure that rate gives, and what the rate is of
RESTORE_REFERENCES = {
    "nas": ("memory_copy_bytes_per_s", "floor", "one copy of them in memory"),
    "object": (
        "object_get_bytes_per_s",
        "single_get",
        "one GET of them as a single object, through the object tier's client,",
    ),
}


def restore_reference(d: dict, tier: str) -> float:
    """The ``<tier>``-vs-resident TTFT ratio of a restore that did nothing but move its bytes
    once at the reference rate: one copy in memory for the NAS (a floor: its page cache is
    memory too), one GET of a single object for the store (what grouping every page into
    one object would give with this client)."""
    _, resident, moved = restore_turn(d, tier)
    if not moved:
        raise KeyError(f"the restore turn took no bytes from {tier}")
    return 1 + moved / d["floors"][RESTORE_REFERENCES[tier][0]] / resident


def _write_share(d: dict) -> float:
    """The share of the tiered no-reuse waves' time that writing their pages to the NAS
    takes by itself: pages of the prompts and answers x the writer's CPU per page."""
    on = d["no_reuse"]["on"]
    tokens = on["prompt_tokens"] + on["output_tps"] * on["seconds"]
    pages = tokens * d["kv_bytes_per_token"] / d["floors"]["page_bytes"]
    return pages * d["floors"]["nas_page_write_cpu_s"] / on["seconds"]


def _workload_figures(c: dict[str, dict], prefix: str) -> dict[str, Callable[[], float]]:
    """Efficiency of each tier against ``infinite``, speedup against ``recompute``."""
    out: dict[str, Callable[[], float]] = {}
    for tier in ("host", "nas", "object"):
        out[f"{prefix}efficiency_rps_{tier}"] = lambda t=tier: c[t]["rps"] / c["infinite"]["rps"]
        out[f"{prefix}efficiency_ttft_{tier}"] = lambda t=tier: (
            c["infinite"]["ttft_p50"] / c[t]["ttft_p50"]
        )
    out[f"{prefix}speedup_rps"] = lambda: c["nas"]["rps"] / c["recompute"]["rps"]
    out[f"{prefix}ttft_speedup_p50"] = lambda: c["recompute"]["ttft_p50"] / c["nas"]["ttft_p50"]
    out[f"{prefix}speedup_bound"] = lambda: c["infinite"]["rps"] / c["recompute"]["rps"]
    out[f"{prefix}speedup_share"] = lambda: (
        (c["nas"]["rps"] / c["recompute"]["rps"] - 1)
        / (c["infinite"]["rps"] / c["recompute"]["rps"] - 1)
    )
    return out


def figures(d: dict) -> dict[str, float | None]:
    """Every figure of the run by name (None where it was not measured); why each missing
    one is missing goes to ``d["figures_why"]``."""
    docqa = _workload_figures(configs_of(d, "docqa"), "docqa_")
    compute: dict[str, Callable[[], float]] = {
        **_workload_figures(configs_of(d, "chat"), ""),
        **docqa,
        "nas_vs_resident_ttft": lambda: _restore(d, "nas"),
        "object_vs_resident_ttft": lambda: _restore(d, "object"),
        "no_reuse_overhead": lambda: _no_reuse_overhead(d),
        "nas_vs_resident_ttft_floor": lambda: restore_reference(d, "nas"),
        "object_vs_resident_ttft_single_get": lambda: restore_reference(d, "object"),
        "no_reuse_write_cpu_share": lambda: _write_share(d),
        "cross_worker_cached_ratio": lambda: configs_of(d, "chat")["gateway_shared"][
            "followup_cached_ratio"
        ],
        "wall_s": lambda: d["seconds"],
    }
    out: dict[str, float | None] = {}
    why: dict[str, str] = {}
    for key, fn in compute.items():
        try:
            out[key] = float(fn())
        except (KeyError, ZeroDivisionError, TypeError, statistics.StatisticsError) as exc:
            out[key], why[key] = None, f"{type(exc).__name__} {exc}"
    d["figures_why"] = why
    return out


#: The issue's acceptance figures: the quick run's bounds, and the full run's where higher.
TARGETS: tuple[Target, ...] = (
    Target("efficiency_rps_nas", "chat requests/s of nas / infinite", ">=", 0.92, 0.95),
    Target("efficiency_ttft_nas", "chat TTFT p50 of infinite / nas", ">=", 0.85),
    Target("efficiency_rps_object", "chat requests/s of object / infinite", ">=", 0.88),
    Target("speedup_share", "chat (speedup_rps - 1) / (speedup_bound - 1): the share of what "
           "any cache could give that nas gives", ">=", 0.85),
    Target("docqa_speedup_rps", "docqa follow-up requests/s of nas / recompute", ">=", 15, 25),
    Target("nas_vs_resident_ttft", "TTFT at 4k history: from L3 / resident in L1", "<=", 1.1),
    Target("object_vs_resident_ttft", "TTFT at 4k history: from L4 / resident in L1", "<=",
           1.4),
    Target("no_reuse_overhead", "1 - requests/s with tiering on / off, no reuse (median "
           "over paired waves)", "<=", 0.01),
    Target("cross_worker_cached_ratio", "cached / prompt tokens of follow-up turns in chat "
           "gateway_shared", ">=", 0.9),
    Target("wall_s", "seconds the whole run took", "<=", 900),
)  # fmt: skip


def verdicts(data: dict) -> dict[str, dict[str, Any]]:
    """``{key: {value, target, met, meaning[, why]}}`` for every target figure."""
    if "figures" not in data:
        data["figures"] = figures(data)
    return {t.key: t.verdict(data) for t in TARGETS}


def physics(data: dict) -> dict[str, Any]:
    """KV size, measured prefill rate and restore bandwidths, and the 4090 prediction."""
    kv = data["kv_bytes_per_token"]
    prefill, bandwidth = {}, {}
    for length, samples in data.get("restore", {}).items():
        rec = samples["recompute"]
        if rec["ttft"] > 0:
            prefill[length] = rec["prompt_tokens"] / rec["ttft"]
        for tier in ("host", "nas", "object"):
            s = samples.get(tier)
            if s is None:  # a run without that tier
                continue
            extra = s["ttft"] - resident_of(samples, tier)["ttft"]
            moved = s["cached_by_tier"].get(tier, 0) * kv
            if moved and extra > 0:
                bandwidth.setdefault(tier, {})[length] = moved / extra
    out: dict[str, Any] = {
        "kv_bytes_per_token": kv,
        "prefill_tokens_per_s": prefill,
        "restore_bytes_per_s": bandwidth,
    }
    if prefill:
        rate = max(prefill.values())
        # fetching beats recomputing when the link moves a token's KV faster than prefill makes it
        out["break_even_bytes_per_s"] = rate * kv
    if "memory_copy_bytes_per_s" in data.get("floors", {}):
        out["floors"] = data["floors"]
    out["rtx4090_prediction"] = predict_4090()
    return out


def predict_4090(history: int = RESTORE_HISTORY) -> dict[str, dict[str, float]]:
    """Recompute vs NAS restore of a ``history``-token turn on an RTX 4090 (labelled model)."""
    out = {}
    for model, (params, kv) in PREDICTED_MODELS.items():
        prefill_rate = PREFILL_MFU * RTX4090_FLOPS / (2 * params)
        row = {"prefill_tokens_per_s": prefill_rate, "recompute_s": history / prefill_rate}
        for link, rate in NAS_LINKS.items():
            restore = history * kv / (rate * LINK_EFFICIENCY)
            row[f"restore_s_{link}"] = restore
            row[f"speedup_{link}"] = row["recompute_s"] / restore
        out[model] = row
    return out


_CONFIG_HEADER = (
    "| configuration | req/s | output tok/s | TTFT p50 s | TTFT p90 s | TTFT p99 s "
    "| TPOT p50 s | cached ratio | follow-up cached | prefilled tok/req | cached by tier "
    "| errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _config_row(name: str, s: dict[str, Any]) -> str:
    prefilled = (s["prompt_tokens"] - s["cached_tokens"]) / max(1, s["requests"])
    tiers = ", ".join(f"{t} {n}" for t, n in sorted(s["cached_by_tier"].items()) if n) or "—"
    return (
        f"| {name} | {s['rps']:.3f} | {s['output_tps']:.1f} | {s['ttft_p50']:.2f} "
        f"| {s['ttft_p90']:.2f} | {s['ttft_p99']:.2f} | {s['tpot_p50']:.3f} "
        f"| {s['cached_ratio']:.2f} | {s['followup_cached_ratio']:.2f} | {prefilled:.0f} "
        f"| {tiers} | {s['errors']} |"
    )


def workload_names(data: dict) -> list[str]:
    """The workloads the run played (``chat`` alone for runs recorded before there were two)."""
    return list(data["workloads"]) if "workloads" in data else ["chat"]


def markdown_table(data: dict) -> str:
    """Per workload its configurations' table, then the targets and the restore table."""
    lines: list[str] = []
    for wl in workload_names(data):
        configs = configs_of(data, wl)
        w = data.get("workloads", {}).get(wl, {})
        lines += [f"**{wl}**" + (
            f" ({w['conversations']} conversations primed, {w['clients']} clients, "
            f"{w['measured_turns']} measured follow-up turns per configuration; pool "
            f"{w['pool_tokens']} tokens, idle histories {w['idle_over_pool']:.1f}x the pool)"
            if "conversations" in w else ""
        ), "", _CONFIG_HEADER]  # fmt: skip
        lines += [_config_row(name, s) for name, s in configs.items()]
        if "first_turns" in w:
            lines.append(_config_row("first turns (priming, on host)", w["first_turns"]))
        lines.append("")
    lines += ["| figure | value | target | verdict |", "|---|---|---|---|"]
    for key, v in data["targets"].items():
        value = "—" if v["value"] is None else f"{v['value']:.3f}"
        lines.append(f"| `{key}` | {value} | {v['target']} | {'met' if v['met'] else 'MISSED'} |")
    others = {k: v for k, v in data.get("figures", {}).items() if k not in data["targets"]}
    if others:
        lines += ["", "| other figure | value |", "|---|---|"]
        lines += [f"| `{k}` | {'—' if v is None else f'{v:.3f}'} |" for k, v in others.items()]
    if data.get("restore"):
        sources = _sources(data)
        lines += ["", "| history tokens | " + " | ".join(sources) + " |",
                  "|---|" + "---|" * len(sources)]  # fmt: skip
        for length, samples in data["restore"].items():
            cells = [_restore_cell(samples[s]) for s in sources]
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        lines.append("\nEach cell: TTFT, then where the cached prompt tokens came from.")
    return "\n".join(lines) + "\n"


_SOURCES = ("resident", "host", "nas", "object", "recompute")


def _sources(data: dict) -> list[str]:
    """The restore sources this run measured (no ``object`` without an object store)."""
    return [s for s in _SOURCES if all(s in v for v in data["restore"].values())]


def _restore_cell(sample: dict[str, Any]) -> str:
    if sample.get("error"):
        return "error"
    tiers = " ".join(f"{t}:{n}" for t, n in sorted(sample["cached_by_tier"].items()))
    return f"{sample['ttft']:.3f} s ({tiers or 'none'})"


def plots(data: dict, out_dir: Path, stem: str) -> list[Path]:
    """One plot per workload (requests/s and TTFT p50 of every configuration, ``infinite``
    marked as the ideal), then the restore plot; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for wl in workload_names(data):
        configs = configs_of(data, wl)
        if not configs:
            continue
        names = list(configs)
        colors = ["tab:gray" if n == "infinite" else "tab:blue" for n in names]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, label in ((ax1, "rps", "requests/s"), (ax2, "ttft_p50", "TTFT p50 (s)")):
            values = [configs[n][key] for n in names]
            bars = ax.bar(names, values, color=colors)
            for bar, n in zip(bars, names, strict=True):
                if n == "infinite":
                    bar.set_hatch("//")
                    ax.axhline(bar.get_height(), color="tab:gray", ls="--", lw=1,
                               label="infinite memory (the ideal)")  # fmt: skip
            ax.set_ylabel(label)
            ax.tick_params(axis="x", rotation=20)
            if "infinite" in names:
                ax.legend(fontsize=8)
        ax1.set_title(f"{wl}: throughput (higher is better)")
        ax2.set_title(f"{wl}: time to first token (lower is better)")
        fig.tight_layout()
        paths.append(out_dir / f"{stem}_{wl}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if data.get("restore"):
        fig, ax = plt.subplots(figsize=(7, 4))
        lengths = list(data["restore"])
        sources = _sources(data)
        width = 0.8 / len(sources)
        for i, source in enumerate(sources):
            xs = [j + i * width for j in range(len(lengths))]
            ax.bar(xs, [data["restore"][n][source]["ttft"] for n in lengths], width, label=source)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))], lengths)
        ax.set_xlabel("history tokens")
        ax.set_ylabel("TTFT seconds (log)")
        ax.set_yscale("log")
        ax.set_title("Restore vs resident")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out_dir / f"{stem}_restore.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def fmt_rate(bytes_per_s: float) -> str:
    """``1.2 GB/s``-style text."""
    if bytes_per_s <= 0 or math.isnan(bytes_per_s):
        return "—"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f} {unit}"
    return f"{bytes_per_s / 1e3:.1f} kB/s"
