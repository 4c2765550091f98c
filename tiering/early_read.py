"""The early NAS read: a fetch's read of the NAS, started before the ledger has answered.

Most restores come from L3, so a fetch starts reading the NAS from the end of the host
prefix at once and the ledger round trip runs alongside; the NAS pages of the plan the
ledger yields then take their answers from this read (:meth:`EarlyRead.pick`). With a
landing the read may also land pages the plan placed in the object store (a NAS file the
ledger does not know yet, or no longer): :meth:`EarlyRead.landed` says which.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tiering.landing import Landed
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
