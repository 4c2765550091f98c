"""Write-behind: evicted pages on their way from host RAM to the NAS, off the serving path.

Pages enter a bounded queue and one task writes them to the NAS in batches, then records
their ledger rows (data first, then the row: a missing row only leaves an orphan that tierd
collects). When the queue is full a page is dropped and counted: serving never waits on a
disk. A failed write leaves the pages in host RAM only, counted and logged.

With a NAS cap (:class:`NasCap`) the writer also leaves out the pages that would take the
NAS's bytes above it, as a full disk would, so the NAS stays within its quota while tierd's
demotion catches up.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence

from protocol.tiers import TierName
from tiering.codec import Block, encoded_size
from tiering.failures import FailureLog
from tiering.ledger import NAS, Entry, Ledger
from tiering.tiers.base import Tier


class NasCap:
    """The NAS's hard byte limit as one writer sees it.

    The bytes in use are the ledger's sum over the NAS (every worker's writes, tierd's
    demotions), read at most every ``refresh_s`` plus what this writer has written since,
    so that a burst does not cost a query per batch. Writers in other processes add to
    the NAS between two reads: with ``w`` workers the NAS can pass the cap by at most what
    ``w - 1`` of them write in ``refresh_s``. While the ledger cannot be read the last
    figure stands, and this writer's own writes still count.
    """

    def __init__(
        self,
        ledger: Ledger,
        max_bytes: int,
        *,
        refresh_s: float,
        timeout_s: float,
        failures: FailureLog,
    ) -> None:
        self.ledger = ledger
        self.max_bytes = max_bytes
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.failures = failures
        self._used = 0
        self._read_at: float | None = None

    async def take(self, sizes: Sequence[int]) -> int:
        """Reserve room for the leading pages of ``sizes`` that fit; return how many."""
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.refresh_s:
            self._read_at = now
            try:
                self._used = await asyncio.wait_for(self.ledger.usage(NAS), self.timeout_s)
            except Exception as exc:
                self.failures.record("ledger", "usage", exc)
        taken = 0
        for size in sizes:
            if self._used + size > self.max_bytes:
                break
            self._used += size
            taken += 1
        return taken


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
        max_bytes: int = 0,
        usage_refresh_s: float = 0.5,
    ) -> None:
        """``counters`` and ``failures`` are the store's: drops, writes and errors land there.
        With ``max_bytes``, pages that would take the NAS above it are left out and counted
        as ``write_full`` (:class:`NasCap`, which needs the ledger)."""
        if max_bytes and ledger is None:
            raise ValueError("a NAS cap needs the ledger that sums the NAS's bytes")
        self.nas = nas
        self.cap = (
            NasCap(
                ledger,
                max_bytes,
                refresh_s=usage_refresh_s,
                timeout_s=ledger_timeout_s,
                failures=failures,
            )
            if max_bytes and ledger is not None
            else None
        )
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
        sizes = [encoded_size(b) for b in batch]
        if self.cap is not None:
            fits = await self.cap.take(sizes)
            self.counters["write_full"] += len(batch) - fits
            batch, sizes = batch[:fits], sizes[:fits]
            if not batch:
                return
        try:
            await self.nas.put_many(batch)
        except Exception as exc:  # read-only or full NAS: the pages stay in host RAM only
            self.counters["write_failed"] += len(batch)
            self.failures.record(TierName.NAS, "write", exc)
            return
        self.counters["written"] += len(batch)
        if self.ledger is None:
            return
        entries = [Entry(b.namespace, b.key, size) for b, size in zip(batch, sizes, strict=True)]
        try:  # data first, then its row; a missing row only leaves an orphan tierd collects
            await asyncio.wait_for(self.ledger.record(entries, NAS), self.ledger_timeout_s)
        except Exception as exc:
            self.failures.record("ledger", "record", exc)
