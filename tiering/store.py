"""The tiered store: the ladder below the GPU as one object the engine talks to.

Lookups find the longest contiguous prefix of a key chain across host RAM (L2, in
memory), then — through one ledger round trip — the NAS (L3) and the object store (L4)
(:mod:`tiering.locate`). Fetches read the pages (every block verified by its checksum)
under a deadline set by the cost model and promote them into L2 — or, given a
:class:`~tiering.landing.Landing` (the engine's pool pages), put them straight into the
caller's memory, the level above L2. Evicted pages enter L2 at once and are written behind
to the NAS by a background task fed through a bounded queue (:mod:`tiering.write_behind`):
when the queue is full the write is dropped and counted, so serving never waits on a disk. Every backend failure is
counted, logged at a bounded rate and becomes a miss — the engine never sees an exception
from here, it simply recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.tiers import TierName
from tiering.codec import Block
from tiering.cost import CostModel
from tiering.early_read import EarlyFetch, EarlyRead
from tiering.failures import FailureLog
from tiering.landing import Landed, Landing
from tiering.ledger import NAS, OBJECT, Ledger
from tiering.locate import Locator
from tiering.tiers.base import Answers, Tier
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasTier
from tiering.write_behind import WriteBehind


@dataclass(frozen=True)
class StoreConfig:
    """Queues, batches and timeouts of the tiered store."""

    #: evicted pages waiting to be written to the NAS; beyond this they are dropped
    write_queue_pages: int = 4096
    write_batch_pages: int = 64
    #: bound on one ledger round trip on the serving path
    ledger_timeout_s: float = 0.5
    #: how often coalesced last-access touches are written
    touch_flush_s: float = 1.0
    #: bytes of pages that fetches started for queued requests may hold until those are
    #: scheduled; beyond this the oldest is dropped (its request fetches when scheduled)
    early_fetch_bytes: int = 1 << 30
    error_log_interval_s: float = 30.0
    #: hard cap on the NAS's bytes per the ledger (0 = none): see
    #: :class:`~tiering.write_behind.NasCap`
    nas_max_bytes: int = 0
    #: how often the writer re-reads the NAS's bytes from the ledger under a cap
    nas_usage_refresh_s: float = 0.5


@dataclass(frozen=True)
class Fetched:
    """Pages of a chain's prefix, in order: the tier each came from, and the blocks (none
    when the pages were fetched into a :class:`~tiering.landing.Landing`)."""

    blocks: list[Block]
    tiers: list[str]


class TieredStore:
    """Host RAM, NAS and object store behind lookup/fetch/fetch_early/offer.

    All methods run on one event loop (the adapter owns it). ``nas``, ``obj`` and
    ``ledger`` are optional: a worker without them keeps only the host tier.
    """

    def __init__(
        self,
        host: HostTier,
        *,
        nas: NasTier | None = None,
        obj: Tier | None = None,
        ledger: Ledger | None = None,
        cost: CostModel | None = None,
        config: StoreConfig | None = None,
        resources: contextlib.AsyncExitStack | None = None,
    ) -> None:
        """``resources`` (pools, clients the tiers use) are closed by :meth:`close`."""
        self.host = host
        self.tiers: dict[str, Tier] = {TierName.HOST: host}
        if nas is not None:
            self.tiers[TierName.NAS] = nas
        if obj is not None:
            self.tiers[TierName.OBJECT] = obj
        self.ledger = ledger
        self.cost = cost or CostModel()
        self.config = config or StoreConfig()
        self.failures = FailureLog(self.config.error_log_interval_s)
        self.counters: Counter[str] = Counter()
        self.fetch_seconds: Counter[str] = Counter()
        self._spill = (
            None
            if nas is None
            else WriteBehind(
                nas,
                ledger,
                queue_pages=self.config.write_queue_pages,
                batch_pages=self.config.write_batch_pages,
                ledger_timeout_s=self.config.ledger_timeout_s,
                counters=self.counters,
                failures=self.failures,
                max_bytes=self.config.nas_max_bytes,
                usage_refresh_s=self.config.nas_usage_refresh_s,
            )
        )
        self._locator = Locator(
            host,
            self.tiers,
            ledger,
            timeout_s=self.config.ledger_timeout_s,
            failures=self.failures,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._early: dict[bytes, EarlyFetch] = {}
        self._closing = asyncio.Event()
        self._resources = resources

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> TieredStore:
        """Start the write-behind and touch-flush tasks."""
        if not self._tasks:
            self._closing.clear()
            if self._spill is not None:
                self._tasks.append(asyncio.create_task(self._spill.run(), name="kv-write-behind"))
            if self.ledger is not None:
                self._tasks.append(asyncio.create_task(self._flush_loop(), name="kv-touches"))
        return self

    async def close(self, *, drain: bool = True) -> None:
        """Stop background work; with ``drain`` first write what is queued."""
        if drain:
            await self.drain()
        self._closing.set()
        early = [e.task for e in self._early.values()]
        self._early.clear()
        for task in [*self._tasks, *early]:
            task.cancel()
        for task in [*self._tasks, *early]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._flush_touches()
        if self._resources is not None:
            await self._resources.aclose()

    async def drain(self) -> None:
        """Wait until every queued page has been written (or has failed)."""
        if self._spill is not None:
            await self._spill.drain()

    # --- spill path -------------------------------------------------------------------------
    def offer(self, blocks: Sequence[Block], *, owned: bool = False) -> None:
        """Take evicted pages: into host RAM now, onto the NAS later. Never blocks.

        ``owned`` says each payload is a private buffer of its own that nobody writes again:
        host RAM then keeps it instead of copying it (see :meth:`HostTier.put_now`)."""
        for block in blocks:
            self.host.put_now(block, owned=owned)
        if self._spill is not None:
            self._spill.put(blocks)

    async def _flush_loop(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.config.touch_flush_s)
            await self._flush_touches()

    async def _flush_touches(self) -> None:
        if self.ledger is None or not self.ledger.pending_touches:
            return
        try:
            await asyncio.wait_for(self.ledger.flush_touches(), self.config.ledger_timeout_s * 4)
        except Exception as exc:
            self.failures.record("ledger", "touch", exc)

    def touch(self, keys: Sequence[bytes]) -> None:
        """Note a use of ``keys`` served from above the tiers (the engine's L1): their ledger
        rows' last access moves on the next flush, as a fetch's would."""
        if self.ledger is not None:
            self.ledger.touch(keys)

    # --- lookup -------------------------------------------------------------------------------
    async def lookup(self, namespace: bytes, keys: Sequence[bytes]) -> list[str]:
        """The tier holding each page of the longest prefix of ``keys`` found anywhere
        (see :class:`~tiering.locate.Locator`); :meth:`fetch` verifies it by reading."""
        return await self._locator.lookup(namespace, keys)

    # --- fetch ----------------------------------------------------------------------------------
    async def fetch(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        tokens_per_page: int,
        *,
        page_bytes: int,
        into: Landing | None = None,
        promote: bool = True,
    ) -> Fetched:
        """Read the longest available prefix of ``keys`` that is worth fetching.

        ``page_bytes`` is the size of one page's KV (for the cost model's prediction). A tier
        is used only while fetching from it is predicted to beat recomputing; each tier's
        read is abandoned at its deadline, and the prefix ends at the first page that could
        not be read and verified.

        Without ``into`` the pages come back as blocks and are promoted into host RAM. With
        it, page ``i`` lands in ``into``'s page ``i`` (``into`` holds at least as many pages
        as ``keys``) and ``blocks`` stays empty: the pages are in the caller's memory, the
        level above this store, and reach host RAM again when that level evicts them.
        ``promote=False`` leaves host RAM alone (a fetch whose pages are wanted once).
        A landing fetch whose keys an :meth:`fetch_early` began takes that fetch's pages.
        """
        if into is not None and keys and (started := self._early.pop(keys[0], None)):
            tiers = await started.take(keys, into)
            if tiers:
                self.counters["early_fetch_used"] += 1
                return self._fetched(keys, Fetched([], tiers))
        early = self._read_nas_early(keys, tokens_per_page, page_bytes, into)
        found = await self.lookup(namespace, keys)
        plan = self.cost.worth_fetching(found, tokens_per_page, page_bytes)
        if len(plan) < len(found):
            self.counters[f"skipped_{found[len(plan)]}"] += len(found) - len(plan)
        if early is not None and TierName.NAS not in plan and into is None:
            early.cancel()
            early = None
        if not plan:
            if early is not None:
                early.cancel()
            return Fetched([], [])
        got: list[Block | Landed | None] = [None] * len(plan)
        runs: dict[str, list[int]] = {}
        in_ram: list[int] = []  # RAM needs no deadline, and a miss there repairs nothing
        for i, tier in enumerate(plan):
            if tier == TierName.HOST and into is None:
                got[i] = self.host.get_now(keys[i])
            else:
                (in_ram if tier == TierName.HOST else runs.setdefault(tier, [])).append(i)
        copied, *results = await asyncio.gather(
            self.host.land([keys[i] for i in in_ram], into, in_ram) if in_ram else _nothing(),
            *(
                early.pick(idx)
                if t == TierName.NAS and early is not None
                else self._read_tier(t, keys, idx, tokens_per_page, into)
                for t, idx in runs.items()
            ),
        )
        for i, answer in zip(in_ram, copied, strict=True):
            got[i] = answer
        # A landing's early NAS read may take pages the ledger placed elsewhere (a file not
        # yet, or no longer, in the ledger): a page lands once, so theirs is the copy. Its
        # threads may still hold pages after it overran or failed, and the tier the plan
        # chose is then REFUSED: no proof about that tier's copy, so only MISSING repairs.
        landed_early = set() if into is None or early is None else await early.landed()
        abandoned = into is not None and into.closed
        for (tier, idx), answers in zip(runs.items(), results, strict=True):
            if answers is None:
                continue  # the tier failed as a whole: a miss, but no proof the data is gone
            for i, answer in zip(idx, answers, strict=True):
                got[i] = answer
            missing = [
                keys[i]
                for i, a in zip(idx, answers, strict=True)
                if a is None or a is Landed.MISSING
            ]
            nas = self.tiers.get(TierName.NAS)
            if missing and tier == TierName.NAS and early is not None and isinstance(nas, NasTier):
                # The early read looked before the ledger answered: a page written and
                # recorded in between (write-behind) was absent then and is not lost.
                missing = await nas.absent(missing)
            if missing and not abandoned:  # an abandoned landing stops reading: no proof either
                await self._repair(tier, missing)
        return self._fetched(keys, self._assemble(namespace, plan, got, landed_early, promote))

    def _fetched(self, keys: Sequence[bytes], out: Fetched) -> Fetched:
        """Count ``out``'s hits and the misses after it, note its pages' use."""
        for tier, n in Counter(out.tiers).items():
            self.counters[f"hit_{tier}"] += n
        self.counters["miss"] += len(keys) - len(out.tiers)
        if self.ledger is not None:
            self.ledger.touch(keys[: len(out.tiers)])
        return out

    def fetch_early(
        self, namespace: bytes, keys: Sequence[bytes], tokens_per_page: int, *, page_bytes: int
    ) -> None:
        """Start fetching ``keys``' prefix for a request that is queued, not yet scheduled:
        the landing fetch it makes when scheduled, for keys starting at ``keys[0]``, takes
        these pages (see :class:`~tiering.early_read.EarlyFetch`). Never blocks."""
        if not keys or self._closing.is_set():
            return
        old = self._early.pop(keys[0], None)
        if old is not None:
            old.task.cancel()
        held = len(keys) * page_bytes
        while (
            self._early and held + self._early_pages() * page_bytes > self.config.early_fetch_bytes
        ):
            dropped = self._early.pop(next(iter(self._early)))
            dropped.task.cancel()
            self.counters["early_fetch_dropped"] += 1

        async def blocks() -> tuple[list[Block], list[str]]:
            out = await self.fetch(
                namespace, keys, tokens_per_page, page_bytes=page_bytes, promote=False
            )
            return out.blocks, out.tiers

        self._early[keys[0]] = EarlyFetch(tuple(keys), asyncio.create_task(blocks()))
        self.counters["early_fetch"] += 1

    def _early_pages(self) -> int:
        return sum(len(e.keys) for e in self._early.values())

    def _assemble(
        self,
        namespace: bytes,
        plan: list[str],
        got: list[Block | Landed | None],
        landed_early: set[int],
        promote: bool = True,
    ) -> Fetched:
        """The prefix of the plan whose pages all arrived, promoting blocks into RAM."""
        out = Fetched([], [])
        for i, (tier, answer) in enumerate(zip(plan, got, strict=True)):
            if isinstance(answer, Block):
                if answer.namespace != namespace:
                    break
                out.blocks.append(answer)
                if promote and tier != TierName.HOST:  # the next turn finds it in RAM
                    self.host.put_now(answer, owned=True)
            elif not answer and i in landed_early:
                tier = TierName.NAS
            elif not answer:
                break
            out.tiers.append(tier)
        return out

    def _read_nas_early(
        self, keys: Sequence[bytes], tokens_per_page: int, page_bytes: int, into: Landing | None
    ) -> EarlyRead | None:
        """Start reading the NAS past the host prefix while the ledger is still answering
        (see :mod:`tiering.early_read`). A page the ledger places elsewhere costs one failed
        open (and counts as a NAS miss)."""
        if TierName.NAS not in self.tiers or self.ledger is None:
            return None
        start = self.host.prefix_now(keys)
        n = len(keys) - start
        if n == 0 or not self.cost.should_fetch(TierName.NAS, n * page_bytes, n * tokens_per_page):
            return None
        idx = list(range(start, len(keys)))
        task = asyncio.create_task(self._read_tier(TierName.NAS, keys, idx, tokens_per_page, into))
        return EarlyRead(start, task)

    async def _read_tier(
        self,
        tier: str,
        keys: Sequence[bytes],
        idx: list[int],
        tokens_per_page: int,
        into: Landing | None,
    ) -> Answers | None:
        """The tier's answer for each of ``keys[i]``, ``i`` in ``idx`` (a block, or with
        ``into`` what became of page ``i``); None when the tier failed or overran."""
        wanted = [keys[i] for i in idx]
        deadline = self.cost.deadline(tier, len(wanted) * tokens_per_page)
        read = (
            self.tiers[tier].get_many(wanted)
            if into is None
            else self.tiers[tier].land(wanted, into, idx)
        )
        start = time.perf_counter()
        try:
            answers: Answers = await asyncio.wait_for(read, deadline)
        except TimeoutError:
            self.failures.record(
                tier, "deadline", f"{len(wanted)} pages not read in {deadline:.3f}s"
            )
            return None
        except Exception as exc:
            self.failures.record(tier, "read", exc)
            return None
        elapsed = time.perf_counter() - start
        if into is None:
            n_bytes = sum(b.nbytes for b in answers if isinstance(b, Block))
        else:
            n_bytes = sum(1 for a in answers if a is Landed.LANDED) * into.check.payload_bytes
        self.fetch_seconds[tier] += elapsed
        self.cost.observe(tier, n_bytes, elapsed)
        return answers

    async def _repair(self, tier: str, keys: list[bytes]) -> None:
        """The ledger claimed pages the tier could not produce: correct the ledger."""
        self.counters[f"repaired_{tier}"] += len(keys)
        if self.ledger is None:
            return
        try:
            await asyncio.wait_for(
                self.ledger.drop(keys, NAS if tier == TierName.NAS else OBJECT),
                self.config.ledger_timeout_s,
            )
        except Exception as exc:
            self.failures.record("ledger", "repair", exc)

    # --- observability ------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Everything /metrics needs: per-tier counters, store counters, failures, cost model."""
        return {
            "tiers": {name: tier.stats() for name, tier in self.tiers.items()},
            "store": dict(self.counters),
            "fetch_seconds": dict(self.fetch_seconds),
            "failures": {f"{t}.{k}": n for (t, k), n in self.failures.counts.items()},
            "write_queue": 0 if self._spill is None else self._spill.queued(),
            "cost": self.cost.snapshot(),
        }


async def _nothing() -> list[Landed]:
    return []
