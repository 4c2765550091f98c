"""Admission's patience with held-back pages.

A restore that misses its deadline leaves its target pages *held back* in the pool: the
late read may still write them, so nobody may reuse them until it gives them back. When
only such pages stand between the request at the head of the queue and the room it needs,
admission waits for them, a little at a time (nothing else could run meanwhile). It does
not wait for ever: a read that never returns (a hung NFS mount) would stall every request
behind it, so after :data:`HELD_BACK_GIVE_UP_S` the request is refused, and so is each next
one at once while the same pages are still out.
"""

from __future__ import annotations

import logging
import time

from workers.engine.kv_pool import KVPool

log = logging.getLogger(__name__)

#: how long admission waits for held-back pages each time before it looks again
HELD_BACK_WAIT_S = 0.05
#: how long admission waits in all for held-back pages on one request's behalf before it
#: refuses the request that needs them instead of waiting forever
HELD_BACK_GIVE_UP_S = 30.0


class HeldBackWait:
    """Whether admission should wait for ``pool``'s held-back pages, per request at the head
    of the queue. Not thread-safe: the engine's thread alone calls it."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        #: the request waited for, and since when
        self._waiting: tuple[str, float] | None = None
        #: the pool's ``(holds, held_back)`` when the last wait ran out: while no page was
        #: held back or given back since, the same pages are still out, and waiting for
        #: them again would bring nothing back
        self._given_up: tuple[int, int] | None = None

    def should_wait(self, rid: str) -> bool:
        """True while request ``rid``, which cannot get room otherwise, should wait for
        held-back pages; False when none are out or its wait has run out."""
        if not self.pool.held_back:
            return False
        out = (self.pool.holds, self.pool.held_back)
        if self._given_up == out:
            return False
        now = time.monotonic()
        if self._waiting is None or self._waiting[0] != rid:
            self._waiting = (rid, now)  # a new head of the queue starts its own wait
        waited = now - self._waiting[1]
        if waited < HELD_BACK_GIVE_UP_S:
            return True
        log.warning(
            "%d pool pages are still held by tier reads after %.0f s; requests that need "
            "them are refused until they come back",
            self.pool.held_back,
            waited,
        )
        self._given_up = out
        return False

    def wait(self) -> None:
        """Block up to :data:`HELD_BACK_WAIT_S` for a held-back page to come back."""
        self.pool.wait_given_back(HELD_BACK_WAIT_S)
