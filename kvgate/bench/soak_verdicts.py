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


#: the memory figure a part is judged by (see :mod:`kvgate.bench.soak_sampling`); RSS for
#: the others
JUDGED_MEMORY = {"postgres": "anon"}


@dataclass
class Samples:
    """What the run saw: per part, resident bytes and descriptors; the tiers' bytes."""

    t: list[float] = field(default_factory=list)
    rss: dict[str, list[int]] = field(default_factory=dict)
    #: proportional set size (PSS: each shared page counted once), summed over a part's processes
    pss: dict[str, list[int]] = field(default_factory=dict)
    procs: dict[str, list[int]] = field(default_factory=dict)
    fds: dict[str, list[int]] = field(default_factory=dict)
    nas: list[int] = field(default_factory=list)
    objects: list[int] = field(default_factory=list)
    #: per part, per process id, the figure :data:`JUDGED_MEMORY` names at each sample (None
    #: while the process was not there)
    lived: dict[str, dict[str, list[int | None]]] = field(default_factory=dict)

    def add_lived(self, by_part: dict[str, dict[str, int]]) -> None:
        """Add one sample of :attr:`lived`: per part, per process id, the judged figure.

        Call it after appending the sample's time to :attr:`t`: every series is then as long
        as :attr:`t`, with None where a process was not there (not yet, or no more).
        """
        n = len(self.t)
        for part, by_pid in by_part.items():
            lived = self.lived.setdefault(part, {})
            for pid, value in by_pid.items():
                series = lived.setdefault(pid, [])
                series.extend([None] * (n - 1 - len(series)))
                series.append(value)
        for series in (s for part in self.lived.values() for s in part.values()):
            series.extend([None] * (n - len(series)))


#: fifths of the run that are warm-up: memory is judged from the next fifth to the last.
#: SeaweedFS sets it: its live heap (the filer's fixed-size metadata log rings) fills by
#: minute 6 of a 30-minute soak, and its RSS, the heap's pages touched on the way to the
#: collector's goal, levels off by minute 12, at GOGC=100 and at 25 alike (its RSS by fifth
#: in the run on 7eaaa69: 167, 218, 232, 231, 236 MiB).
WARM_UP_FIFTHS = 2


def _windows(n: int, warm_up: int = WARM_UP_FIFTHS) -> tuple[range, range]:
    """The samples just after ``warm_up`` fifths of ``n``, and those of the last fifth."""
    return range(warm_up * n // 5, (warm_up + 1) * n // 5), range(4 * n // 5, n)


def _enough(n: int) -> None:
    if n < 10:
        raise click.ClickException(f"{n} samples are too few to judge growth: run longer")


def growth(series: list[int]) -> float:
    """Median of the last fifth against the median of the fifth after warm-up."""
    _enough(len(series))
    early_at, late_at = _windows(len(series))
    early = statistics.median(series[i] for i in early_at)
    late = statistics.median(series[i] for i in late_at)
    return (late - early) / early if early else 0.0


def lived_growth(
    by_pid: dict[str, list[int | None]], warm_up: int = WARM_UP_FIFTHS
) -> tuple[float, float, float, int]:
    """Growth of the processes that were there in every sample of both windows (after
    ``warm_up`` fifths, and the last fifth), each against itself: ``(growth, early bytes,
    late bytes, processes)``.

    A pool that opens a backend, or closes one, moves a part's sum without anything leaking;
    a process whose own memory keeps rising is the leak a soak looks for.
    """
    n = max((len(s) for s in by_pid.values()), default=0)
    _enough(n)
    early_at, late_at = _windows(n, warm_up)
    early = late = 0.0
    processes = 0
    for series in by_pid.values():
        early_values = [series[i] for i in early_at]
        late_values = [series[i] for i in late_at]
        if None in early_values or None in late_values:
            continue
        early += statistics.median(early_values)  # type: ignore[type-var]
        late += statistics.median(late_values)  # type: ignore[type-var]
        processes += 1
    return ((late - early) / early if early else 0.0), early, late, processes


def verdicts(samples: Samples) -> dict[str, Any]:
    """Per part, memory and descriptor growth with a verdict; the tiers against limits."""
    parts = {}
    for part, fds in sorted(samples.fds.items()):
        n = len(fds)
        # per process: Postgres' pools open and close whole backends (~30 files each)
        procs = samples.procs[part]
        per_proc = [f / max(p, 1) for f, p in zip(fds, procs, strict=True)]
        early_at, late_at = _windows(n)
        fd_late = statistics.median(per_proc[i] for i in late_at)
        fd_change = fd_late - statistics.median(per_proc[i] for i in early_at)
        # A leak keeps adding descriptors: the end's typical count passes the highest seen
        # after warm-up. A server's client connections come and go with the load's bursts
        # (SeaweedFS: 137 to 171 through a soak, 171 by minute 2), which moves one window's
        # median against another's without anything leaking.
        fd_leak = fd_change > FD_JITTER and fd_late > max(per_proc[i] for i in early_at)
        mem_growth, early, late, lived = lived_growth(samples.lived[part])
        parts[part] = {
            "memory": JUDGED_MEMORY.get(part, "rss"),
            "mib_after_warmup": early / MIB,
            "mib_at_end": late / MIB,
            "growth": mem_growth,
            "processes_judged": lived,
            # the same from the second fifth, as judged before the warm-up was two fifths
            "growth_from_second_fifth": lived_growth(samples.lived[part], warm_up=1)[0],
            "rss_growth": growth(samples.rss[part]),
            "pss_growth": growth(samples.pss[part]),
            "pss_mib_at_end": statistics.median(samples.pss[part][i] for i in late_at) / MIB,
            "processes_at_end": max(samples.procs[part][i] for i in late_at),
            "fds_change": fd_change,
            "fds_early_max": max(per_proc[i] for i in early_at),
            "ok": mem_growth < GROWTH_LIMIT and not fd_leak,
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
