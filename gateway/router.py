"""Which worker serves a request: consistent hashing with bounded load, plus affinity.

Each conversation has a session key; its hash picks a point on a ring of worker replicas
(virtual nodes), and the request goes to the first worker clockwise that is healthy and
below the load bound: ``max(ceil(k / n), floor(load_factor * k / n))`` in-flight requests,
``k`` counting this one. So turns of one conversation land where their KV cache is, no
worker carries more than ``load_factor`` times the mean, and adding or removing a worker
moves only its share of conversations. A conversation pushed off its hash point by the
bound is remembered, so its next turns follow it rather than re-rolling the dice.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable

from protocol.registry import WorkerInfo

_VNODES = 100
_AFFINITY_MAX = 100_000


def point(text: str) -> int:
    """A stable 64-bit hash of ``text`` (same on every replica and every run)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Router:
    """Chooses workers and counts this replica's in-flight requests per worker."""

    def __init__(self, load_factor: float) -> None:
        self._factor = load_factor
        self._workers: dict[str, WorkerInfo] = {}
        self._rings: dict[str, tuple[list[int], list[str], list[str]]] = {}
        self._inflight: dict[str, int] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()

    def update(self, workers: Iterable[WorkerInfo]) -> None:
        """Replace the set of healthy workers (rings are rebuilt only when it changed)."""
        fresh = {w.worker_id: w for w in workers}
        if {k: (w.url, w.model) for k, w in fresh.items()} != {
            k: (w.url, w.model) for k, w in self._workers.items()
        }:
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
        total = sum(self._inflight.get(w, 0) for w in candidates) + 1
        n = len(candidates)
        bound = max(math.ceil(total / n), math.floor(self._factor * total / n))
        allowed = set(candidates)

        def fits(worker_id: str) -> bool:
            return worker_id in allowed and self._inflight.get(worker_id, 0) < bound

        remembered = self._affinity.get(session)
        if remembered is not None and fits(remembered):
            return self._pick(session, remembered)
        start = bisect.bisect(points, point(session))
        seen: set[str] = set()
        for i in range(len(owners)):
            worker_id = owners[(start + i) % len(owners)]
            if worker_id in seen:
                continue
            seen.add(worker_id)
            if fits(worker_id):
                return self._pick(session, worker_id)
        least = min(candidates, key=lambda w: self._inflight.get(w, 0))
        return self._pick(session, least)

    def _pick(self, session: str, worker_id: str) -> WorkerInfo:
        self._affinity[session] = worker_id
        self._affinity.move_to_end(session)
        if len(self._affinity) > _AFFINITY_MAX:
            self._affinity.popitem(last=False)
        return self._workers[worker_id]

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
