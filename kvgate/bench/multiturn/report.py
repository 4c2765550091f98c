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
    """One target figure: how to compute it and what it must reach."""

    key: str
    meaning: str
    op: str
    bound: float
    compute: Callable[[dict], float | None]

    def verdict(self, data: dict) -> dict[str, Any]:
        try:
            value = self.compute(data)
        except (KeyError, ZeroDivisionError, TypeError) as exc:
            value, why = None, f"not measured: {type(exc).__name__} {exc}"
        else:
            why = "" if value is not None else "not measured"
        met = value is not None and (
            value >= self.bound if self.op == ">=" else value <= self.bound
        )
        return {"value": value, "target": f"{self.op} {self.bound:g}", "met": met,
                "meaning": self.meaning, **({"why": why} if why else {})}  # fmt: skip


def _cfg(d: dict, name: str, key: str) -> float:
    return d["configs"][name][key]


def _no_reuse_overhead(d: dict) -> float:
    """1 - requests/s on / off as the median over the measured waves of each wave's own
    ``1 - off seconds / on seconds``: a wave plays the same requests on both sides, so one
    wave stalled by the machine (51 s against 27-36 s for the others, seen here) moves a
    sum of seconds by a tenth but leaves this median where the other waves put it."""
    on, off = (d["no_reuse"][side]["wave_seconds"][1:] for side in ("on", "off"))
    return statistics.median(1 - f / n for n, f in zip(on, off, strict=True))


def _restore(d: dict, source: str) -> float:
    samples = d["restore"][str(RESTORE_HISTORY)]
    return samples[source]["ttft"] / samples["resident"]["ttft"]


TARGETS: tuple[Target, ...] = (
    Target("speedup_rps", "requests/s of nas / recompute", ">=", 6,
           lambda d: _cfg(d, "nas", "rps") / _cfg(d, "recompute", "rps")),
    Target("ttft_speedup_p50", "p50 TTFT of recompute / nas", ">=", 6,
           lambda d: _cfg(d, "recompute", "ttft_p50") / _cfg(d, "nas", "ttft_p50")),
    Target("nas_vs_resident_ttft", "TTFT at 4k history: from L3 / resident in L1", "<=", 1.5,
           lambda d: _restore(d, "nas")),
    Target("object_vs_resident_ttft", "TTFT at 4k history: from L4 / resident in L1", "<=", 3,
           lambda d: _restore(d, "object")),
    Target("no_reuse_overhead", "1 - requests/s with tiering on / off, no reuse (median "
           "over paired waves)", "<=", 0.02, _no_reuse_overhead),
    Target("cross_worker_cached_ratio", "cached / prompt tokens of follow-up turns in "
           "gateway_shared", ">=", 0.8,
           lambda d: _cfg(d, "gateway_shared", "followup_cached_ratio")),
)  # fmt: skip


#: the restore figures and the tier each one measures
RESTORE_FIGURES = {"nas_vs_resident_ttft": "nas", "object_vs_resident_ttft": "object"}


def restore_shortfall(data: dict, key: str) -> str:
    """Why restore figure ``key`` missed: the bandwidth its bound needed, and the measured."""
    tier = RESTORE_FIGURES[key]
    bound = next(t.bound for t in TARGETS if t.key == key)
    samples = data["restore"][str(RESTORE_HISTORY)]
    resident = samples["resident"]["ttft"]
    moved = samples[tier]["cached_by_tier"].get(tier, 0) * data["kv_bytes_per_token"]
    allowed = (bound - 1) * resident
    got = moved / max(samples[tier]["ttft"] - resident, 1e-9)
    return (
        f"{moved / 1e6:.0f} MB of KV had {allowed:.3f} s over the resident turn, "
        f"{fmt_rate(moved / allowed)}; `{tier}` delivered {fmt_rate(got)}"
    )


def no_reuse_shortfall(data: dict) -> str:
    """Why ``no_reuse_overhead`` missed: every measured wave's own overhead, and where the
    tiered worker's extra work runs."""
    on, off = (data["no_reuse"][side]["wave_seconds"][1:] for side in ("on", "off"))
    waves = ", ".join(f"{1 - f / n:+.1%}" for n, f in zip(on, off, strict=True))
    cpus = data.get("machine", {}).get("cpus")
    where = f"this machine's {cpus} cores" if cpus else "the machine's cores"
    return (
        f"the measured waves cost {waves} with tiering on; keying, copying and writing every "
        f"request's pages runs on threads that take {where} from the engine's OpenMP team, "
        "which waits for a preempted thread at each of a step's parallel regions"
    )


def shortfall(data: dict, key: str) -> str:
    """Why target figure ``key`` (measured, missed) missed, where the run can tell."""
    if key in RESTORE_FIGURES:
        return restore_shortfall(data, key)
    if key == "no_reuse_overhead":
        return no_reuse_shortfall(data)
    return ""


def verdicts(data: dict) -> dict[str, dict[str, Any]]:
    """``{key: {value, target, met, meaning[, why]}}`` for every target figure."""
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
            extra = s["ttft"] - samples["resident"]["ttft"]
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


def markdown_table(data: dict) -> str:
    """The per-configuration table, the targets and the restore table, as markdown."""
    lines = [
        "| configuration | req/s | output tok/s | TTFT p50 s | TTFT p90 s | TTFT p99 s "
        "| TPOT p50 s | cached ratio | follow-up cached | prefilled tok/req | cached by tier "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in data["configs"].items():
        prefilled = (s["prompt_tokens"] - s["cached_tokens"]) / max(1, s["requests"])
        tiers = ", ".join(f"{t} {n}" for t, n in sorted(s["cached_by_tier"].items())) or "—"
        lines.append(
            f"| {name} | {s['rps']:.3f} | {s['output_tps']:.1f} | {s['ttft_p50']:.2f} "
            f"| {s['ttft_p90']:.2f} | {s['ttft_p99']:.2f} | {s['tpot_p50']:.3f} "
            f"| {s['cached_ratio']:.2f} | {s['followup_cached_ratio']:.2f} | {prefilled:.0f} "
            f"| {tiers} | {s['errors']} |"
        )
    lines += ["", "| figure | value | target | verdict |", "|---|---|---|---|"]
    for key, v in data["targets"].items():
        value = "—" if v["value"] is None else f"{v['value']:.3f}"
        lines.append(f"| `{key}` | {value} | {v['target']} | {'met' if v['met'] else 'MISSED'} |")
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
    """Throughput, TTFT and restore plots as PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = list(data["configs"])
    if names:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        ax1.bar(names, [data["configs"][n]["rps"] for n in names], color="tab:blue")
        ax1.set_ylabel("requests/s")
        ax1.set_title("Throughput")
        for q, color in (("ttft_p50", "tab:green"), ("ttft_p90", "tab:orange")):
            ax2.plot(names, [data["configs"][n][q] for n in names], "o-", label=q, color=color)
        ax2.set_ylabel("seconds")
        ax2.set_yscale("log")
        ax2.set_title("Time to first token")
        ax2.legend()
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        paths.append(out_dir / f"{stem}_configs.png")
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
