"""Per-run statistics of a multi-turn run: throughput, latency percentiles, cache reuse."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from kvgate.bench.multiturn.driver import Result


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Summary:
    """What one run measured over its non-warm-up requests."""

    requests: int
    errors: int
    seconds: float
    rps: float
    output_tps: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    latency_p50: float
    prompt_tokens: int
    cached_tokens: int
    cached_ratio: float
    #: cached / prompt tokens of turns after the first (the ones that can reuse history)
    followup_cached_ratio: float
    cached_by_tier: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


def summarize(results: Sequence[Result], seconds: float | None = None) -> Summary:
    """Statistics of ``results`` without warm-up requests; errors are counted, not timed.

    Requests/s is measured requests over the window from the first measured request's
    start to the last one's end, so the warm-up's tail does not count as idle time; or over
    ``seconds`` when given (requests played in separate windows: their total length).
    """
    measured = [r for r in results if not r.warmup]
    ok = [r for r in measured if not r.error]
    if seconds is None:
        seconds = max(r.start + r.latency for r in ok) - min(r.start for r in ok) if ok else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    follow = [r for r in ok if r.turn > 0]
    follow_prompt = sum(r.prompt_tokens for r in follow)
    tiers: Counter[str] = Counter()
    for r in ok:
        tiers.update(r.cached_by_tier)
    ttfts = [r.ttft for r in ok]
    return Summary(
        requests=len(ok),
        errors=len(measured) - len(ok),
        seconds=seconds,
        rps=len(ok) / seconds if seconds else 0.0,
        output_tps=sum(r.output_tokens for r in ok) / seconds if seconds else 0.0,
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        ttft_p99=percentile(ttfts, 99),
        tpot_p50=percentile([r.tpot for r in ok], 50),
        latency_p50=percentile([r.latency for r in ok], 50),
        prompt_tokens=prompt,
        cached_tokens=cached,
        cached_ratio=cached / prompt if prompt else 0.0,
        followup_cached_ratio=(
            sum(r.cached_tokens for r in follow) / follow_prompt if follow_prompt else 0.0
        ),
        cached_by_tier=dict(tiers),
    )
