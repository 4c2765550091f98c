"""Reads started early: the NAS read of a fetch before the ledger has answered, and a
whole fetch before the request that wants it has been scheduled.

Most restores come from L3, so a fetch starts reading the NAS from the end of the host
prefix at once and the ledger round trip runs alongside; the NAS pages of the plan the
ledger yields then take their answers from this read (:meth:`EarlyRead.pick`). With a
landing the read may also land pages the plan placed in the object store (a NAS file the
ledger does not know yet, or no longer): :meth:`EarlyRead.landed` says which.

A follow-up turn whose history is on the NAS or in the object store waits in the worker's
queue before it is scheduled; :class:`EarlyFetch` is the fetch started when it was
admitted there, whose pages the scheduled fetch then lands from memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from tiering.codec import Block
from tiering.landing import Landed, Landing
from tiering.tiers.base import Answers


@dataclass(frozen=True)
class EarlyRead:
    """The read of keys ``start`` onwards, as a task answering for each of them."""

    start: int
    task: asyncio.Task[Answers | None]

    def cancel(self) -> None:
        """Stop waiting for the read (a landing's close() fences what its threads still do)."""
        self.task.cancel()

    async def pick(self, idx: list[int]) -> Answers | None:
        """The answers for plan positions ``idx``; None when the read failed or overran.

        The read began at the host prefix, and a lookup never places a lower tier before
        it, so every position is covered.
        """
        answers = await self.task
        return None if answers is None else [answers[i - self.start] for i in idx]

    async def landed(self) -> set[int]:
        """Positions the read landed in a landing (it runs to its end with one).

        A read that failed or overran lands nothing as far as the fetch knows, although its
        threads may still claim pages: the landing refuses other tiers those pages, which
        therefore answer ``REFUSED``, never ``MISSING``.
        """
        try:
            answers = await self.task
        except asyncio.CancelledError:
            return set()
        return {self.start + j for j, a in enumerate(answers or ()) if a is Landed.LANDED}


@dataclass(frozen=True)
class EarlyFetch:
    """A fetch started when a request was admitted to a worker's queue, before it had pool
    pages to land in: its blocks wait here until the request is scheduled, and the fetch
    the scheduler then makes takes them (:meth:`take`) instead of reading again, so that
    the time the request queued hid the read."""

    keys: tuple[bytes, ...]
    #: the fetched prefix as blocks (not promoted into host RAM), with each block's tier
    task: asyncio.Task[tuple[list[Block], list[str]]]

    async def take(self, keys: Sequence[bytes], into: Landing) -> list[str] | None:
        """Land the fetched pages that begin ``keys`` into ``into``; their tiers in order,
        or None when the early fetch failed (the caller then fetches as usual)."""
        try:
            blocks, tiers = await self.task
        except Exception:  # a failed early fetch is a miss: the scheduled fetch reads again
            return None
        out: list[str] = []
        for i, (key, block, tier) in enumerate(zip(keys, blocks, tiers, strict=False)):
            if key != self.keys[i] or not into.fill(i, block):
                break
            out.append(tier)
        return out
