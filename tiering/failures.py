"""Counting tier failures and logging them at a bounded rate.

A dead NAS or S3 can fail every request; logging each would drown the log and slow the
worker. Every failure is counted by ``(tier, kind)``; a warning is logged at most once
per ``interval`` for each pair, saying how many were suppressed since.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

log = logging.getLogger("kvgate.tiering")


class FailureLog:
    """Counters of failures by ``(tier, kind)`` with rate-limited warnings."""

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self.counts: Counter[tuple[str, str]] = Counter()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def record(self, tier: str, kind: str, exc: BaseException | str) -> None:
        """Count one failure and log it unless one was logged within ``interval``."""
        key = (tier, kind)
        self.counts[key] += 1
        now = time.monotonic()
        last_time, last_count = self._last.get(key, (-float("inf"), 0))
        if now - last_time >= self.interval:
            suppressed = self.counts[key] - last_count - 1
            more = f" ({suppressed} similar since last report)" if suppressed > 0 else ""
            detail = str(exc) or type(exc).__name__  # TimeoutError has no message
            log.warning("tier %s: %s failed: %s%s", tier, kind, detail, more)
            self._last[key] = (now, self.counts[key])

    def count(self, tier: str, kind: str | None = None) -> int:
        """Failures counted for ``tier`` (of one ``kind``, or all)."""
        return sum(n for (t, k), n in self.counts.items() if t == tier and kind in (None, k))
