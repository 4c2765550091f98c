"""Which worker serves a request: consistent hashing with bounded load, per conversation.

Each conversation has a session key. A new session hashes to a point on a ring of worker
replicas (virtual nodes) and is assigned to the first worker clockwise that is usable and
below both bounds, ``max(ceil(x / n), floor(load_factor * x / n))`` for ``x`` the active
sessions and, separately, the in-flight requests (each counting the newcomer). So no
worker holds more than ``load_factor`` times the mean, turns of a conversation find the
worker that holds their KV cache, and adding or removing a worker moves only its share.

Later turns follow their session's assignment; only when that worker is gone, failing, or
far above the mean in flight (``load_factor * mean + 2``) is the session reassigned.
Checking later turns against the tight bound would scatter them: while a burst ramps up
the mean is tiny, and whichever conversations arrive first would push others off their
workers. Sessions idle for ``session_ttl_s`` are forgotten.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from protocol.registry import WorkerInfo

_VNODES = 100
_SESSIONS_MAX = 100_000
#: In-flight requests a session's worker may carry above ``load_factor * mean`` before
#: the session moves.
_HOT_SLACK = 2


def point(text: str) -> int:
    """A stable 64-bit hash of ``text`` (same on every replica and every run)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def bound(total: int, n: int, factor: float) -> int:
    """Most any of ``n`` workers may carry of ``total``: ``factor`` x mean, rounded so it fits."""
    return max(math.ceil(total / n), math.floor(factor * total / n))


class Router:
    """Chooses workers; counts this replica's sessions and in-flight requests per worker."""

    def __init__(
        self,
        load_factor: float,
        session_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factor = load_factor
        self._ttl = session_ttl_s
        self._clock = clock
        self._workers: dict[str, WorkerInfo] = {}
        self._rings: dict[str, tuple[list[int], list[str], list[str]]] = {}
        self._inflight: dict[str, int] = {}
        #: session -> (worker id, last use), oldest use first
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._held: dict[str, int] = {}  # worker id -> sessions assigned

    def update(self, workers: Iterable[WorkerInfo]) -> None:
        """Replace the set of healthy workers (rings are rebuilt only when it changed)."""
        fresh = {w.worker_id: w for w in workers}
        if {k: w.model for k, w in fresh.items()} != {k: w.model for k, w in self._workers.items()}:
            rings: dict[str, list[tuple[int, str]]] = {}
            for w in fresh.values():
                ring = rings.setdefault(w.model, [])
                ring.extend((point(f"{w.worker_id}#{i}"), w.worker_id) for i in range(_VNODES))
            self._rings = {}
            for model, ring in rings.items():
                ring.sort()
                owners = [w for _, w in ring]
                self._rings[model] = ([p for p, _ in ring], owners, sorted(set(owners)))
        self._workers = fresh

    def models(self) -> list[str]:
        """Models served by at least one healthy worker."""
        return sorted(self._rings)

    def workers(self) -> list[WorkerInfo]:
        """The healthy workers."""
        return list(self._workers.values())

    def choose(self, model: str, session: str, usable: Callable[[str], bool]) -> WorkerInfo | None:
        """The worker for ``session`` on ``model`` among those ``usable`` says yes to."""
        ring = self._rings.get(model)
        if ring is None:
            return None
        points, owners, distinct = ring
        candidates = [w for w in distinct if usable(w)]
        if not candidates:
            return None
        now = self._clock()
        self._expire(now)
        n = len(candidates)
        busy = sum(self._inflight.get(w, 0) for w in candidates) + 1
        current = self._sessions.get(session)
        if current is not None:
            worker_id = current[0]
            hot = self._factor * busy / n + _HOT_SLACK
            if worker_id in candidates and self._inflight.get(worker_id, 0) < hot:
                return self._assign(session, worker_id, now)
        held = sum(self._held.get(w, 0) for w in candidates)
        if current is None or current[0] not in candidates:
            held += 1  # this session is new to the candidates
        max_held = bound(held, n, self._factor)
        max_busy = bound(busy, n, self._factor)
        start = bisect.bisect(points, point(session))
        seen: set[str] = set()
        allowed = set(candidates)
        for i in range(len(owners)):
            worker_id = owners[(start + i) % len(owners)]
            if worker_id in seen or worker_id not in allowed:
                continue
            seen.add(worker_id)
            mine = 1 if current is not None and current[0] == worker_id else 0
            if (
                self._held.get(worker_id, 0) - mine < max_held
                and self._inflight.get(worker_id, 0) < max_busy
            ):
                return self._assign(session, worker_id, now)
        least = min(candidates, key=lambda w: self._inflight.get(w, 0))
        return self._assign(session, least, now)

    def _assign(self, session: str, worker_id: str, now: float) -> WorkerInfo:
        previous = self._sessions.pop(session, None)
        if previous is not None:
            self._drop_hold(previous[0])
        self._sessions[session] = (worker_id, now)
        self._held[worker_id] = self._held.get(worker_id, 0) + 1
        if len(self._sessions) > _SESSIONS_MAX:
            _, (old, _) = self._sessions.popitem(last=False)
            self._drop_hold(old)
        return self._workers[worker_id]

    def _expire(self, now: float) -> None:
        while self._sessions:
            session, (worker_id, used) = next(iter(self._sessions.items()))
            if now - used < self._ttl:
                return
            del self._sessions[session]
            self._drop_hold(worker_id)

    def _drop_hold(self, worker_id: str) -> None:
        left = self._held.get(worker_id, 0) - 1
        if left > 0:
            self._held[worker_id] = left
        else:
            self._held.pop(worker_id, None)

    def acquire(self, worker_id: str) -> None:
        """Count a request now in flight to ``worker_id``."""
        self._inflight[worker_id] = self._inflight.get(worker_id, 0) + 1

    def release(self, worker_id: str) -> None:
        """Count a request to ``worker_id`` as finished."""
        left = self._inflight.get(worker_id, 0) - 1
        if left > 0:
            self._inflight[worker_id] = left
        else:
            self._inflight.pop(worker_id, None)

    def inflight(self) -> dict[str, int]:
        """In-flight requests per worker, from this replica."""
        return dict(self._inflight)
