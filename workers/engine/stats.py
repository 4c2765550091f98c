"""The engine's counters: what /metrics and the benchmarks read, kept by the scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol.tiers import TIERS


@dataclass
class EngineStats:
    """Monotonic counters since start (for /metrics). Mixed steps split time by token share."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    evicted_pages: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    steps: int = 0

    def record_step(self, chunk_tokens: Sequence[int], seconds: float) -> None:
        """Count one forward step of chunks with ``chunk_tokens`` tokens each.

        A one-token chunk is a decode; longer ones are prefill. A mixed step's ``seconds``
        are split between the two by token share (a single wall time covers both).
        """
        decode = sum(1 for n in chunk_tokens if n == 1)
        total = sum(chunk_tokens)
        self.steps += 1
        self.decode_tokens += decode
        self.prefill_tokens += total - decode
        self.decode_seconds += seconds * decode / total
        self.prefill_seconds += seconds * (total - decode) / total
