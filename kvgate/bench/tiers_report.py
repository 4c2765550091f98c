"""The report of ``kvgate bench tiers``: the targets of the tiering issue, and the markdown."""

from __future__ import annotations

from typing import Any

#: restore speed over raw speed, per tier
TARGETS = {"host": 0.8, "nas": 0.7, "object": 0.7}
UPSERTS_TARGET = 50_000
LOOKUP_P99_TARGET_MS = 2.0


def verdicts(figures: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(target, met, figures) for every target of the tiering issue."""
    out = [
        (f"{t} restore >= {r:g} x raw", figures[t]["ratio"] >= r,
         f"{figures[t]['restore_gbps']:.2f} / {figures[t]['raw_gbps']:.2f} GB/s = {figures[t]['ratio']:.2f}")
        for t, r in TARGETS.items()
    ]  # fmt: skip
    led = figures["ledger"]
    out.append(
        (
            f"ledger >= {UPSERTS_TARGET:,} upserts/s",
            led["upserts_per_s"] >= UPSERTS_TARGET,
            f"{led['upserts_per_s']:,.0f}/s",
        )
    )
    out.append((f"256-key lookup p99 <= {LOOKUP_P99_TARGET_MS:g} ms", led["lookup_p99_ms"] <= LOOKUP_P99_TARGET_MS, f"{led['lookup_p99_ms']:.2f} ms"))  # fmt: skip
    return out


def render(figures: dict[str, Any], *, page_bytes: int) -> str:
    """The Markdown report of ``figures`` (``page_bytes``: the size of one page)."""
    run = figures["run"]
    lines = [
        "# Tier restore speed and ledger throughput",
        "",
        f"Measured by `kvgate bench tiers` on {run['when']}"
        + (f" (commit `{run['commit']}`)" if run.get("commit") else "")
        + ", "
        f"{run['machine']} with {run['cpus']} logical CPUs; {run['pages']} pages of "
        f"{page_bytes // 1024} KiB per tier, best of {run['reps']} alternating runs.",
        "",
        "Restore = the tiered store's fetch (ledger lookup, read, checksum) with every page "
        "ending in a destination buffer, as restored pages end in the engine's pool: the NAS "
        "reads each page straight into it and verifies it there, host RAM and S3 bodies are "
        "copied into it; raw = the same bytes from the same device at the same concurrency "
        "(memcpy; plain file reads; plain S3 GETs). The NAS here is a local directory, hot in "
        "the page cache.",
        "",
        f"Load average (1 min) {run['loadavg_before']:.1f} before and "
        f"{run['loadavg_after']:.1f} after the run on {run['cpus']} CPUs. With "
        "more runnable processes than CPUs, latencies (the ledger p99 above all) measure "
        "queueing for a CPU as much as the code.",
        "",
        "| tier | restore GB/s | raw GB/s | ratio |",
        "|---|---:|---:|---:|",
        *(
            f"| {t} | {figures[t]['restore_gbps']:.2f} | {figures[t]['raw_gbps']:.2f} | {figures[t]['ratio']:.2f} |"
            for t in TARGETS
        ),
        "",
        "Like for like, with the raw reads also copied into the destination that restore "
        f"ends with: NAS raw {figures['nas']['raw_into_gbps']:.2f} GB/s, restore "
        f"{figures['nas']['ratio_like_for_like']:.2f} x that; object raw "
        f"{figures['object']['raw_into_gbps']:.2f} GB/s, restore "
        f"{figures['object']['ratio_like_for_like']:.2f} x.",
        "",
        f"Ledger: {figures['ledger']['upserts_per_s']:,.0f} upserts/s (batches of 4096, 4 writers); "
        f"256-key prefix lookup p50 {figures['ledger']['lookup_p50_ms']:.2f} ms, "
        f"p99 {figures['ledger']['lookup_p99_ms']:.2f} ms.",
        "",
        "| target | met | figures |",
        "|---|---|---|",
        *(f"| {t} | {'yes' if m else 'NO'} | {d} |" for t, m, d in verdicts(figures)),
        "",
    ]
    return "\n".join(lines)
