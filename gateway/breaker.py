"""A circuit breaker per worker: sideline one that keeps failing, then try it again.

After ``failures`` consecutive failures a worker's circuit opens for ``open_s`` seconds and
it gets no traffic. Afterwards it is tried again: one success closes the circuit, another
failure opens it for another ``open_s``. This keeps a dead worker from costing every
request a connect attempt in the window before the registry notices it stopped
heartbeating. (No single-trial half-open state: the router asks about every candidate
before it picks one, so a claimed trial could go unused and sideline a worker for good.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _State:
    failures: int = 0
    open_until: float = 0.0


class Breaker:
    """Tracks worker health from request outcomes."""

    def __init__(
        self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._threshold = failures
        self._open_s = open_s
        self._clock = clock
        self._states: dict[str, _State] = {}

    def allows(self, worker_id: str) -> bool:
        """Whether ``worker_id`` may get a request now."""
        state = self._states.get(worker_id)
        return (
            state is None or state.failures < self._threshold or self._clock() >= state.open_until
        )

    def success(self, worker_id: str) -> None:
        """A request to ``worker_id`` went through: close its circuit."""
        self._states.pop(worker_id, None)

    def failure(self, worker_id: str) -> None:
        """A request to ``worker_id`` failed."""
        state = self._states.setdefault(worker_id, _State())
        state.failures += 1
        if state.failures >= self._threshold:
            state.open_until = self._clock() + self._open_s
