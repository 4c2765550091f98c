"""Write-behind: evicted pages on their way from host RAM to the NAS, off the serving path.

Pages enter a bounded queue and one task writes them to the NAS in batches, then records
their ledger rows (data first, then the row: a missing row only leaves an orphan that tierd
collects). When the queue is full a page is dropped and counted: serving never waits on a
disk. A failed write leaves the pages in host RAM only, counted and logged.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from protocol.tiers import TierName
from tiering.codec import Block, encode_header
from tiering.failures import FailureLog
from tiering.ledger import NAS, Entry, Ledger
from tiering.tiers.base import Tier


class WriteBehind:
    """A bounded queue of pages for the NAS and the task that empties it (:meth:`run`)."""

    def __init__(
        self,
        nas: Tier,
        ledger: Ledger | None,
        *,
        queue_pages: int,
        batch_pages: int,
        ledger_timeout_s: float,
        counters: Counter[str],
        failures: FailureLog,
    ) -> None:
        """``counters`` and ``failures`` are the store's: drops, writes and errors land there."""
        self.nas = nas
        self.ledger = ledger
        self.batch_pages = batch_pages
        self.ledger_timeout_s = ledger_timeout_s
        self.counters = counters
        self.failures = failures
        self._queue: asyncio.Queue[Block] = asyncio.Queue(queue_pages)
        #: pages taken and not yet written (queued, or in the batch being written)
        self._unwritten = 0

    def put(self, blocks: Sequence[Block]) -> None:
        """Queue ``blocks``; those that do not fit are dropped and counted. Never blocks."""
        for block in blocks:
            try:
                self._queue.put_nowait(block)
            except asyncio.QueueFull:
                self.counters["write_dropped"] += 1
            else:
                self._unwritten += 1

    def queued(self) -> int:
        """Pages taken and not written yet: waiting, or in the batch being written now (0
        means the NAS has everything it was given, or its writes failed)."""
        return self._unwritten

    async def drain(self) -> None:
        """Wait until every queued page has been written (or has failed)."""
        await self._queue.join()

    async def run(self) -> None:
        """Write queued pages in batches, forever (cancel to stop)."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.batch_pages and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            finally:
                self._unwritten -= len(batch)
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[Block]) -> None:
        try:
            await self.nas.put_many(batch)
        except Exception as exc:  # read-only or full NAS: the pages stay in host RAM only
            self.counters["write_failed"] += len(batch)
            self.failures.record(TierName.NAS, "write", exc)
            return
        self.counters["written"] += len(batch)
        if self.ledger is None:
            return
        entries = [Entry(b.namespace, b.key, len(encode_header(b)) + b.nbytes) for b in batch]
        try:  # data first, then its row; a missing row only leaves an orphan tierd collects
            await asyncio.wait_for(self.ledger.record(entries, NAS), self.ledger_timeout_s)
        except Exception as exc:
            self.failures.record("ledger", "record", exc)
