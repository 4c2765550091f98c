"""How ``kvgate bench soak`` judges what it sampled: growth after warm-up per part, and the
tiers against their limits (see :mod:`kvgate.bench.soak` for what is sampled and why)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import click

MIB = 1 << 20
#: tier limits of the soak's stack: the NAS's cap (workers write nothing that would pass it)
#: and the watermarks tierd keeps it between; the object store's cap (tierd's trim)
LIMITS = {"nas_max": 16 * MIB, "nas_high": 12 * MIB, "nas_low": 8 * MIB, "object_max": 64 * MIB}
#: growth of a part's memory or descriptors after warm-up that counts as a leak
GROWTH_LIMIT = 0.05
#: descriptors a part's processes may gain each after warm-up without counting as a leak
FD_JITTER = 4


@dataclass
class Samples:
    """What the run saw: per part, resident bytes and descriptors; the tiers' bytes."""

    t: list[float] = field(default_factory=list)
    rss: dict[str, list[int]] = field(default_factory=dict)
    #: private memory (USS) and proportional set size (PSS), summed over a part's processes
    uss: dict[str, list[int]] = field(default_factory=dict)
    pss: dict[str, list[int]] = field(default_factory=dict)
    procs: dict[str, list[int]] = field(default_factory=dict)
    fds: dict[str, list[int]] = field(default_factory=dict)
    nas: list[int] = field(default_factory=list)
    objects: list[int] = field(default_factory=list)


#: the memory figure a part is judged by (see :mod:`kvgate.bench.soak`); RSS for the others
JUDGED_MEMORY = {"postgres": "uss"}


def growth(series: list[int]) -> float:
    """Median of the last fifth against the median of the second fifth (after warm-up)."""
    n = len(series)
    if n < 10:
        raise click.ClickException(f"{n} samples are too few to judge growth: run longer")
    early = statistics.median(series[n // 5 : 2 * n // 5])
    late = statistics.median(series[4 * n // 5 :])
    return (late - early) / early if early else 0.0


def verdicts(samples: Samples) -> dict[str, Any]:
    """Per part, memory and descriptor growth with a verdict; the tiers against limits."""
    parts = {}
    for part, fds in sorted(samples.fds.items()):
        n = len(fds)
        judged = JUDGED_MEMORY.get(part, "rss")
        mem = getattr(samples, judged)[part]
        # per process: Postgres' pools open and close whole backends (~30 files each)
        procs = samples.procs[part]
        per_proc = [f / max(p, 1) for f, p in zip(fds, procs, strict=True)]
        fd_change = statistics.median(per_proc[4 * n // 5 :]) - statistics.median(
            per_proc[n // 5 : 2 * n // 5]
        )
        mem_growth = growth([m / max(p, 1) for m, p in zip(mem, procs, strict=True)])
        parts[part] = {
            "memory": judged,
            "mib_after_warmup": statistics.median(mem[n // 5 : 2 * n // 5]) / MIB,
            "mib_at_end": statistics.median(mem[4 * n // 5 :]) / MIB,
            "growth": mem_growth,
            "rss_growth": growth(samples.rss[part]),
            "pss_growth": growth(samples.pss[part]),
            "pss_mib_at_end": statistics.median(samples.pss[part][4 * n // 5 :]) / MIB,
            "processes_at_end": max(samples.procs[part][4 * n // 5 :]),
            "fds_change": fd_change,
            "ok": mem_growth < GROWTH_LIMIT and fd_change <= FD_JITTER,
        }
    warm = len(samples.nas) // 5
    nas_over = sum(b > LIMITS["nas_max"] for b in samples.nas[warm:])
    nas_high = sum(b > LIMITS["nas_high"] for b in samples.nas[warm:])
    obj_over = sum(b > LIMITS["object_max"] for b in samples.objects[warm:])
    measured = max(1, len(samples.nas) - warm)
    tiers = {
        "nas_max_mib": max(samples.nas) / MIB,
        "nas_over_limit_share": nas_over / measured,
        "nas_over_high_share": nas_high / measured,
        "object_max_mib": max(samples.objects) / MIB,
        "object_over_limit_share": obj_over / measured,
        "ok": nas_over == obj_over == 0,
    }
    return {"parts": parts, "tiers": tiers}
