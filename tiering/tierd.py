"""tierd: keeps the shared tiers within their limits and the ledger true.

One pass, in order:

1. **Reconcile** the NAS and the object store with the ledger (every
   ``reconcile_interval_s``, since it walks everything): rows whose data is gone lose
   their tier bit; blocks without a row (a writer died between data and row, or a ledger
   write failed) are deleted once older than a grace period; stale temporary files from
   dead writers are removed.
2. **Retention** and **per-namespace quotas**: pages idle too long, and a namespace's
   coldest pages beyond its quota, are deleted from every tier this tierd reaches (without
   an object store, from the NAS only: their rows keep the object bit, and are not
   selected again).
3. **NAS watermarks**: above the high watermark, the least recently used pages are copied
   to the object store (verified on the way: only blocks that decode are uploaded; a page
   whose row already claims an object is copied too unless a HEAD finds the object) and
   only then deleted from the NAS, down to the low watermark. Room is made in the object
   store before each upload, so that it never holds more than its limit.
4. **Object-store capacity**: above its limit (a lowered limit, or a demotion larger than
   it), the coldest objects are deleted.

Between passes tierd checks the NAS's bytes in the ledger every ``watermark_check_s`` (one
sum over the ledger) and starts a pass at once when they cross the high watermark: writers fill the
NAS at their own pace, and a watermark acted on only every ``interval_s`` would be overshot
by whatever they write in an interval.

Any number of tierd processes may run: each pass takes a Postgres advisory lock and a
process that cannot get it skips the pass, so no page is ever demoted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from tiering.codec import encoded_size
from tiering.failures import FailureLog
from tiering.ledger import NAS, OBJECT, Entry, Ledger, Row
from tiering.tiers.nas import NasTier
from tiering.tiers.object import ObjectTier

#: "kvtierd": the advisory lock every tierd holds for the length of a pass (one id for all)
PASS_LOCK = 0x6B7674696572640


@dataclass(frozen=True)
class TierdConfig:
    """Limits tierd enforces; a limit of 0 means none."""

    nas_high_bytes: int = 0
    nas_low_bytes: int = 0
    object_max_bytes: int = 0
    retention_s: float = 0.0
    namespace_quota_bytes: int = 0
    batch_pages: int = 256
    #: blocks without a ledger row younger than this are left alone (a writer may be
    #: between writing the data and recording its row)
    orphan_grace_s: float = 600.0
    interval_s: float = 30.0
    #: between passes, how often the NAS's bytes are compared with the high watermark
    #: (a pass starts at once above it); 0: only every ``interval_s``
    watermark_check_s: float = 1.0
    #: reconciling walks the whole NAS and bucket, so it runs on this slower clock
    reconcile_interval_s: float = 600.0


@dataclass
class PassReport:
    """What one pass did (all counts in pages unless named bytes)."""

    skipped: bool = False
    demoted: int = 0
    nas_deleted: int = 0
    object_deleted: int = 0
    expired: int = 0
    over_quota: int = 0
    orphans_deleted: int = 0
    rows_repaired: int = 0
    nas_bytes: int = 0
    object_bytes: int = 0
    errors: list[str] = field(default_factory=list)


class Tierd:
    """One tierd: a ledger pool, the NAS and (optionally) the object store."""

    def __init__(
        self, pool: asyncpg.Pool, nas: NasTier, obj: ObjectTier | None, config: TierdConfig
    ) -> None:
        if config.nas_high_bytes and config.nas_low_bytes > config.nas_high_bytes:
            raise ValueError("nas_low_bytes must not exceed nas_high_bytes")
        self.pool = pool
        self.ledger = Ledger(pool)
        self.nas = nas
        self.obj = obj
        #: the tier bits this tierd can delete data from
        self.reach = NAS | (OBJECT if obj is not None else 0)
        self.config = config
        self.failures = FailureLog()
        self._last_reconcile = -float("inf")

    async def run_forever(
        self, stop: asyncio.Event, on_pass: Callable[[PassReport | None], None] | None = None
    ) -> None:
        """Run passes every ``interval_s`` until ``stop`` is set; ``on_pass`` hears of each
        (``None`` for a pass that failed as a whole)."""
        while not stop.is_set():
            report: PassReport | None = None
            try:
                report = await self.run_pass()
            except Exception as exc:  # Postgres down: try again next interval
                self.failures.record("tierd", "pass", exc)
            if on_pass is not None:
                on_pass(report)
            await self._until_next_pass(stop)

    async def _until_next_pass(self, stop: asyncio.Event) -> None:
        """Wait ``interval_s``, or less: until ``stop``, or until a check finds the NAS
        above its high watermark."""
        deadline = time.monotonic() + self.config.interval_s
        check = self.config.watermark_check_s if self.config.nas_high_bytes else 0.0
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(left, check) if check else left)
                return
            if check and await self._nas_over_high():
                return

    async def _nas_over_high(self) -> bool:
        try:
            return await self.ledger.usage(NAS) > self.config.nas_high_bytes
        except Exception as exc:  # Postgres down: the pass at the interval will say so
            self.failures.record("tierd", "watermark check", exc)
            return False

    async def run_pass(self) -> PassReport:
        """One pass, or a report with ``skipped`` when another tierd is mid-pass."""
        report = PassReport()
        async with self.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", PASS_LOCK):
                report.skipped = True
                return report
            steps = [self._expire, self._quotas, self._demote, self._cap]
            if time.monotonic() - self._last_reconcile >= self.config.reconcile_interval_s:
                self._last_reconcile = time.monotonic()
                steps.insert(0, self._reconcile)
            try:
                for step in steps:
                    try:
                        await step(report)
                    except Exception as exc:  # one broken tier must not stop the others
                        self.failures.record("tierd", step.__name__.strip("_"), exc)
                        report.errors.append(f"{step.__name__.strip('_')}: {exc}")
                report.nas_bytes = await self.ledger.usage(NAS)
                report.object_bytes = await self.ledger.usage(OBJECT)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", PASS_LOCK)
        return report

    # --- reconcile ------------------------------------------------------------------------------
    async def _keys_with(self, tier: int) -> set[bytes]:
        rows = await self.pool.fetch(
            "SELECT key FROM kv_ledger WHERE tiers & $1::smallint <> 0", tier
        )
        return {r["key"] for r in rows}

    async def _reconcile(self, report: PassReport) -> None:
        cutoff = time.time() - self.config.orphan_grace_s
        # Rows are read before the scan: data is written before its row, so a row seen
        # here whose file the later scan misses has really lost its data.
        rows = await self._keys_with(NAS)
        entries = await asyncio.to_thread(lambda: list(self.nas.scan()))
        on_disk = {e.key for e in entries if e.key is not None}
        await self._repair(rows - on_disk, NAS, report)
        # a block missing from the first read may have got its row since: ask again
        maybe = [e.key for e in entries if e.key is not None and e.key not in rows]
        held = await self.ledger.held(maybe, NAS) if maybe else set()
        for e in entries:
            if e.mtime < cutoff and (e.key is None or (e.key not in rows and e.key not in held)):
                self.nas.remove(e.path)  # a dead writer's temporary, or data without a row
                report.orphans_deleted += 1
        if self.obj is None:
            return
        rows = await self._keys_with(OBJECT)
        found = [e async for e in self.obj.scan()]
        await self._repair(rows - {e.key for e in found if e.key}, OBJECT, report)
        maybe = [e for e in found if e.key not in rows]
        held = await self.ledger.held([e.key for e in maybe if e.key], OBJECT) if maybe else set()
        dead = [e.name for e in maybe if e.key not in held and e.mtime < cutoff]
        await self.obj.delete_names(dead)
        report.orphans_deleted += len(dead)

    async def _repair(self, keys: set[bytes], tier: int, report: PassReport) -> None:
        if keys:
            await self.ledger.drop(keys, tier)
            report.rows_repaired += len(keys)

    # --- deleting from every tier ---------------------------------------------------------------
    async def _delete_everywhere(self, rows: Sequence[Row]) -> int:
        """Delete ``rows``' pages from every tier this tierd reaches and clear those bits;
        how many rows changed. A bit for a tier not reached here is kept (its data is still
        there), so callers select only rows holding a tier in :attr:`reach`: the others
        would come back unchanged in every batch."""
        await self.nas.delete_many([r.key for r in rows if r.tiers & NAS])
        if self.obj is not None:
            await self.obj.delete_many([r.key for r in rows if r.tiers & OBJECT])
        return await self.ledger.drop([r.key for r in rows], self.reach)

    async def _expire(self, report: PassReport) -> None:
        if not self.config.retention_s:
            return
        cutoff = datetime.now(UTC) - timedelta(seconds=self.config.retention_s)
        batch = self.config.batch_pages
        while rows := await self.ledger.idle_since(cutoff, batch, self.reach):
            if not await self._delete_everywhere(rows):
                break  # changed by another process meanwhile: the next pass goes on
            report.expired += len(rows)
            if len(rows) < batch:
                break

    async def _quotas(self, report: PassReport) -> None:
        quota = self.config.namespace_quota_bytes
        if not quota:
            return
        for namespace, used in await self.ledger.over_quota(quota):
            while used > quota:
                rows = await self.ledger.coldest_in(namespace, self.config.batch_pages, self.reach)
                if not rows:
                    break
                rows = _enough(rows, used - quota)
                if not await self._delete_everywhere(rows):
                    break
                used -= sum(r.size for r in rows)
                report.over_quota += len(rows)

    # --- NAS watermarks and object capacity ------------------------------------------------------
    async def _demote(self, report: PassReport) -> None:
        high, low = self.config.nas_high_bytes, self.config.nas_low_bytes
        used = await self.ledger.usage(NAS)
        if not high or used <= high:
            return
        while used > low:
            rows = await self.ledger.coldest(NAS, self.config.batch_pages)
            if not rows:
                break
            rows = _enough(rows, used - low)
            if self.obj is not None:
                # an object bit is the ledger's word only: the NAS copy may be the last one
                claimed = [r.key for r in rows if r.tiers & OBJECT]
                there = await self.obj.present(claimed) if claimed else set()
                await self._copy_to_object([r for r in rows if r.key not in there], report)
            keys = [r.key for r in rows]
            await self.nas.delete_many(keys)  # only after the copies are recorded
            await self.ledger.drop(keys, NAS)
            report.nas_deleted += len(keys)
            used -= sum(r.size for r in rows)

    async def _copy_to_object(self, rows: list[Row], report: PassReport) -> None:
        assert self.obj is not None
        if not rows:
            return
        blocks = await self.nas.get_many([r.key for r in rows])
        good = [b for b in blocks if b is not None]
        entries = [Entry(b.namespace, b.key, encoded_size(b)) for b in good]
        if self.config.object_max_bytes:
            # room first, so that the store never holds more than its limit
            incoming = sum(e.size for e in entries)
            await self._trim_object(self.config.object_max_bytes - incoming, report)
        await self.obj.put_many(good)  # raises on failure: then nothing is deleted
        await self.ledger.record(entries, OBJECT)
        report.demoted += len(good)

    async def _cap(self, report: PassReport) -> None:
        limit = self.config.object_max_bytes
        if self.obj is not None and limit:
            await self._trim_object(limit, report)

    async def _trim_object(self, target: int, report: PassReport) -> None:
        """Delete the coldest objects until the object tier holds at most ``target`` bytes
        (at least nothing: a batch larger than the limit empties it, and :meth:`_cap`
        trims the batch after)."""
        assert self.obj is not None
        used = await self.ledger.usage(OBJECT)
        while used > max(target, 0):
            rows = await self.ledger.coldest(OBJECT, self.config.batch_pages)
            if not rows:
                break
            rows = _enough(rows, used - max(target, 0))
            await self.obj.delete_many([r.key for r in rows])
            await self.ledger.drop([r.key for r in rows], OBJECT)
            report.object_deleted += len(rows)
            used -= sum(r.size for r in rows)


def _enough(rows: list[Row], excess: int) -> list[Row]:
    """The shortest head of ``rows`` (coldest first) whose sizes add up to ``excess``."""
    total = 0
    for i, row in enumerate(rows):
        total += row.size
        if total >= excess:
            return rows[: i + 1]
    return rows
