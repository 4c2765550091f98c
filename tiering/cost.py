"""When fetching KV from a tier beats recomputing it, learned from real transfers.

Each tier's transfer time is modelled as ``latency + bytes / bandwidth``; both terms are
exponentially weighted moving averages of measured fetches (small transfers teach the
latency, large ones the bandwidth). Recompute time is ``tokens / prefill rate``, the rate
again a moving average of what the engine measured. Until real measurements arrive the
priors below stand in; they are deliberately modest so that a tier must prove itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.tiers import TierName

#: Transfers smaller than this mostly measure latency, larger ones mostly bandwidth.
_LATENCY_BYTES = 64 << 10


@dataclass(frozen=True)
class CostConfig:
    """Priors, smoothing and per-tier time limits for the cost model."""

    alpha: float = 0.2
    prior_latency_s: dict[str, float] = field(
        default_factory=lambda: {TierName.HOST: 20e-6, TierName.NAS: 2e-3, TierName.OBJECT: 20e-3}
    )
    prior_bytes_per_s: dict[str, float] = field(
        default_factory=lambda: {TierName.HOST: 5e9, TierName.NAS: 500e6, TierName.OBJECT: 100e6}
    )
    prior_prefill_tokens_per_s: float = 2000.0
    #: a fetch must be predicted at least this many times faster than recompute
    margin: float = 1.0
    #: hard per-tier deadlines (seconds) for one fetch, whatever the model predicts
    deadline_s: dict[str, float] = field(
        default_factory=lambda: {TierName.HOST: 1.0, TierName.NAS: 2.0, TierName.OBJECT: 5.0}
    )


@dataclass
class _Ewma:
    value: float
    alpha: float

    def update(self, sample: float) -> None:
        self.value += self.alpha * (sample - self.value)


class CostModel:
    """Per-tier latency/bandwidth averages plus the engine's prefill rate."""

    def __init__(self, config: CostConfig | None = None) -> None:
        self.config = c = config or CostConfig()
        self._latency = {t: _Ewma(v, c.alpha) for t, v in c.prior_latency_s.items()}
        self._bandwidth = {t: _Ewma(v, c.alpha) for t, v in c.prior_bytes_per_s.items()}
        self._prefill = _Ewma(c.prior_prefill_tokens_per_s, c.alpha)

    def observe(self, tier: str, n_bytes: int, seconds: float) -> None:
        """Learn from one real fetch of ``n_bytes`` from ``tier`` that took ``seconds``."""
        if seconds <= 0 or tier not in self._latency:
            return
        lat = self._latency[tier]
        if n_bytes < _LATENCY_BYTES:
            lat.update(seconds)
        else:
            transfer = max(seconds - lat.value, seconds * 0.1)  # never credit more than 10x
            self._bandwidth[tier].update(n_bytes / transfer)

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        """Learn the engine's prefill rate from one measured prefill."""
        if n_tokens > 0 and seconds > 0:
            self._prefill.update(n_tokens / seconds)

    def predict_fetch(self, tier: str, n_bytes: int) -> float:
        """Predicted seconds to fetch ``n_bytes`` from ``tier``."""
        return self._latency[tier].value + n_bytes / self._bandwidth[tier].value

    def predict_recompute(self, n_tokens: int) -> float:
        """Predicted seconds to prefill ``n_tokens`` instead."""
        return n_tokens / self._prefill.value

    def should_fetch(self, tier: str, n_bytes: int, n_tokens: int) -> bool:
        """True when fetching from ``tier`` is predicted to beat recomputing ``n_tokens``."""
        if tier not in self._latency:
            return False
        return self.predict_fetch(tier, n_bytes) * self.config.margin < self.predict_recompute(
            n_tokens
        )

    def worth_fetching(self, plan: list[str], tokens_per_page: int, page_bytes: int) -> list[str]:
        """``plan`` (the tier of each page, in order) cut before the first run of pages of
        one lower tier whose fetch is not predicted to beat recomputing it."""
        i = 0
        while i < len(plan):
            tier = plan[i]
            j = i
            while j < len(plan) and plan[j] == tier:
                j += 1
            n = j - i
            if tier != TierName.HOST and not self.should_fetch(
                tier, n * page_bytes, n * tokens_per_page
            ):
                return plan[:i]
            i = j
        return plan

    def deadline(self, tier: str, n_tokens: int) -> float:
        """Seconds after which a fetch from ``tier`` is abandoned and the rest recomputed.

        Past the recompute time a late fetch can only lose; the tier's hard limit caps it.
        A small floor keeps one slow sample from starving a tier forever.
        """
        hard = self.config.deadline_s.get(tier, 1.0)
        return min(hard, max(self.predict_recompute(n_tokens), 0.05))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Current estimates, for /metrics and benchmarks."""
        out = {
            t: {"latency_s": self._latency[t].value, "bytes_per_s": self._bandwidth[t].value}
            for t in self._latency
        }
        out["prefill"] = {"tokens_per_s": self._prefill.value}
        return out
