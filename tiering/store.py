"""The tiered store: the ladder below the GPU as one object the engine talks to.

Lookups find the longest contiguous prefix of a key chain across host RAM (L2, in
memory), then — through one ledger round trip — the NAS (L3) and the object store (L4).
Fetches read the pages (every block verified by its checksum) under a deadline set by the
cost model and promote them into L2. Evicted pages enter L2 at once and are written behind
to the NAS by a background task fed through a bounded queue: when the queue is full the
write is dropped and counted, so serving never waits on a disk. Every backend failure is
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

from tiering.codec import Block, encode_header
from tiering.cost import CostModel
from tiering.failures import FailureLog
from tiering.ledger import NAS, OBJECT, Entry, Ledger
from tiering.tiers.base import Tier
from tiering.tiers.host import HostTier

#: Tiers in ladder order below the device.
LOWER_TIERS: tuple[str, ...] = ("host", "nas", "object")


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
    #: at most this many prefetches in flight; more are dropped
    max_prefetches: int = 8
    error_log_interval_s: float = 30.0


@dataclass(frozen=True)
class Fetched:
    """Pages of a chain's prefix, in order, and the tier each came from."""

    blocks: list[Block]
    tiers: list[str]


class TieredStore:
    """Host RAM, NAS and object store behind lookup/fetch/offer/prefetch.

    All methods run on one event loop (the adapter owns it). ``nas``, ``obj`` and
    ``ledger`` are optional: a worker without them keeps only the host tier.
    """

    def __init__(
        self,
        host: HostTier,
        *,
        nas: Tier | None = None,
        obj: Tier | None = None,
        ledger: Ledger | None = None,
        cost: CostModel | None = None,
        config: StoreConfig | None = None,
        resources: contextlib.AsyncExitStack | None = None,
    ) -> None:
        """``resources`` (pools, clients the tiers use) are closed by :meth:`close`."""
        self.host = host
        self.tiers: dict[str, Tier] = {"host": host}
        if nas is not None:
            self.tiers["nas"] = nas
        if obj is not None:
            self.tiers["object"] = obj
        self.ledger = ledger
        self.cost = cost or CostModel()
        self.config = config or StoreConfig()
        self.failures = FailureLog(self.config.error_log_interval_s)
        self.counters: Counter[str] = Counter()
        self.fetch_seconds: Counter[str] = Counter()
        self._queue: asyncio.Queue[Block] = asyncio.Queue(self.config.write_queue_pages)
        self._tasks: list[asyncio.Task[None]] = []
        self._prefetches: set[asyncio.Task[Fetched]] = set()
        self._closing = asyncio.Event()
        self._resources = resources

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> TieredStore:
        """Start the write-behind and touch-flush tasks."""
        if not self._tasks:
            self._closing.clear()
            self._tasks = [asyncio.create_task(self._write_behind(), name="kv-write-behind")]
            if self.ledger is not None:
                self._tasks.append(asyncio.create_task(self._flush_loop(), name="kv-touches"))
        return self

    async def close(self, *, drain: bool = True) -> None:
        """Stop background work; with ``drain`` first write what is queued."""
        if drain and "nas" in self.tiers:
            await self.drain()
        self._closing.set()
        for task in [*self._tasks, *self._prefetches]:
            task.cancel()
        for task in [*self._tasks, *self._prefetches]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._flush_touches()
        if self._resources is not None:
            await self._resources.aclose()

    async def drain(self) -> None:
        """Wait until every queued page has been written (or has failed)."""
        await self._queue.join()

    # --- spill path -------------------------------------------------------------------------
    def offer(self, blocks: Sequence[Block]) -> None:
        """Take evicted pages: into host RAM now, onto the NAS later. Never blocks."""
        for block in blocks:
            self.host.put_now(block)
            if "nas" not in self.tiers:
                continue
            try:
                self._queue.put_nowait(block)
            except asyncio.QueueFull:
                self.counters["write_dropped"] += 1

    async def _write_behind(self) -> None:
        nas = self.tiers.get("nas")
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.config.write_batch_pages and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                if nas is not None:
                    await self._write_nas(nas, batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write_nas(self, nas: Tier, batch: list[Block]) -> None:
        try:
            await nas.put_many(batch)
        except Exception as exc:  # read-only or full NAS: the pages stay in host RAM only
            self.counters["write_failed"] += len(batch)
            self.failures.record("nas", "write", exc)
            return
        self.counters["written"] += len(batch)
        if self.ledger is None:
            return
        entries = [Entry(b.namespace, b.key, len(encode_header(b)) + b.nbytes) for b in batch]
        try:  # data first, then its row; a missing row only leaves an orphan tierd collects
            await asyncio.wait_for(self.ledger.record(entries, NAS), self.config.ledger_timeout_s)
        except Exception as exc:
            self.failures.record("ledger", "record", exc)

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

    # --- lookup -------------------------------------------------------------------------------
    async def lookup(self, namespace: bytes, keys: Sequence[bytes]) -> list[str]:
        """The tier holding each page of the longest prefix of ``keys`` found anywhere.

        Lower-tier presence comes from the ledger (or, without one, from the NAS itself);
        it is a claim that :meth:`fetch` verifies by reading.
        """
        n_host = self.host.prefix_now(keys)
        plan = ["host"] * n_host
        rest = keys[n_host:]
        if not rest or len(self.tiers) == 1:
            return plan
        lower = await self._lower_prefix(namespace, rest)
        # host RAM may have dropped pages while the ledger answered; the prefix ends there
        n_still = self.host.prefix_now(keys[:n_host])
        if n_still < n_host:
            return plan[:n_still]
        for key, tier in zip(rest, lower, strict=False):
            plan.append("host" if key in self.host else tier)
        return plan

    async def _lower_prefix(self, namespace: bytes, keys: Sequence[bytes]) -> list[str]:
        if self.ledger is not None:
            try:
                bits = await asyncio.wait_for(
                    self.ledger.prefix(namespace, keys), self.config.ledger_timeout_s
                )
            except Exception as exc:  # Postgres down: fall through to asking the NAS
                self.failures.record("ledger", "lookup", exc)
            else:
                usable = []
                for b in bits:
                    if b & NAS and "nas" in self.tiers:
                        usable.append("nas")
                    elif b & OBJECT and "object" in self.tiers:
                        usable.append("object")
                    else:
                        break
                return usable
        nas = self.tiers.get("nas")
        if nas is None:
            return []
        try:
            n = await asyncio.wait_for(nas.longest_prefix(keys), self.config.ledger_timeout_s)
        except Exception as exc:
            self.failures.record("nas", "lookup", exc)
            return []
        return ["nas"] * n

    # --- fetch ----------------------------------------------------------------------------------
    async def fetch(
        self, namespace: bytes, keys: Sequence[bytes], tokens_per_page: int, *, page_bytes: int
    ) -> Fetched:
        """Read the longest available prefix of ``keys`` that is worth fetching.

        ``page_bytes`` is the size of one page's KV (for the cost model's prediction). A tier
        is used only while fetching from it is predicted to beat recomputing; each tier's
        read is abandoned at its deadline, and the prefix ends at the first page that could
        not be read and verified.
        """
        early = self._read_nas_early(keys, tokens_per_page, page_bytes)
        plan = self._worth_fetching(await self.lookup(namespace, keys), tokens_per_page, page_bytes)
        if early is not None and "nas" not in plan:
            early[1].cancel()
            early = None
        if not plan:
            return Fetched([], [])
        got: list[Block | None] = [None] * len(plan)
        runs: dict[str, list[int]] = {}
        for i, tier in enumerate(plan):
            if tier == "host":  # RAM needs neither a task nor a deadline
                got[i] = self.host.get_now(keys[i])
            else:
                runs.setdefault(tier, []).append(i)
        results = await asyncio.gather(
            *(
                self._pick(early, idx)
                if t == "nas" and early is not None
                else self._read_tier(t, [keys[i] for i in idx], tokens_per_page)
                for t, idx in runs.items()
            )
        )
        for (tier, idx), blocks in zip(runs.items(), results, strict=True):
            if blocks is None:
                continue  # the tier failed as a whole: a miss, but no proof the data is gone
            for i, block in zip(idx, blocks, strict=True):
                got[i] = block
            missing = [keys[i] for i, b in zip(idx, blocks, strict=True) if b is None]
            if missing:
                await self._repair(tier, missing)
        out = Fetched([], [])
        for tier, block in zip(plan, got, strict=True):
            if block is None or block.namespace != namespace:
                break
            out.blocks.append(block)
            out.tiers.append(tier)
            if tier != "host":
                self.host.put_now(block, owned=True)  # promotion: the next turn finds it in RAM
        for tier, n in Counter(out.tiers).items():
            self.counters[f"hit_{tier}"] += n
        self.counters["miss"] += len(keys) - len(out.blocks)
        if self.ledger is not None:
            self.ledger.touch(b.key for b in out.blocks)
        return out

    def _read_nas_early(
        self, keys: Sequence[bytes], tokens_per_page: int, page_bytes: int
    ) -> tuple[int, asyncio.Task[list[Block | None] | None]] | None:
        """Start reading the NAS past the host prefix while the ledger is still answering.

        Most restores come from L3; this takes the ledger round trip off their critical
        path. A page the ledger places elsewhere costs one failed open (and counts as a NAS
        miss). Returns the offset of the first key read and the task.
        """
        if "nas" not in self.tiers or self.ledger is None:
            return None
        start = self.host.prefix_now(keys)
        n = len(keys) - start
        if n == 0 or not self.cost.should_fetch("nas", n * page_bytes, n * tokens_per_page):
            return None
        task = asyncio.create_task(self._read_tier("nas", list(keys[start:]), tokens_per_page))
        return start, task

    @staticmethod
    async def _pick(
        early: tuple[int, asyncio.Task[list[Block | None] | None]], idx: list[int]
    ) -> list[Block | None] | None:
        """The early NAS read's answers for plan positions ``idx``.

        The early read began at the host prefix, and :meth:`lookup` never places a lower
        tier before it, so every position is covered.
        """
        start, task = early
        blocks = await task
        return None if blocks is None else [blocks[i - start] for i in idx]

    def _worth_fetching(self, plan: list[str], tokens_per_page: int, page_bytes: int) -> list[str]:
        """Cut ``plan`` before the first tier whose remaining run does not beat recompute."""
        if plan.count("host") == len(plan):
            return plan  # RAM always beats recompute
        i = 0
        while i < len(plan):
            tier = plan[i]
            j = i
            while j < len(plan) and plan[j] == tier:
                j += 1
            n = j - i
            if tier != "host" and not self.cost.should_fetch(
                tier, n * page_bytes, n * tokens_per_page
            ):
                self.counters[f"skipped_{tier}"] += len(plan) - i
                return plan[:i]
            i = j
        return plan

    async def _read_tier(
        self, tier: str, keys: list[bytes], tokens_per_page: int
    ) -> list[Block | None] | None:
        """The tier's answer per key, or None when it failed or overran its deadline."""
        deadline = self.cost.deadline(tier, len(keys) * tokens_per_page)
        start = time.perf_counter()
        try:
            blocks = await asyncio.wait_for(self.tiers[tier].get_many(keys), deadline)
        except TimeoutError:
            self.failures.record(tier, "deadline", f"{len(keys)} pages not read in {deadline:.3f}s")
            return None
        except Exception as exc:
            self.failures.record(tier, "read", exc)
            return None
        elapsed = time.perf_counter() - start
        n_bytes = sum(b.nbytes for b in blocks if b is not None)
        self.fetch_seconds[tier] += elapsed
        self.cost.observe(tier, n_bytes, elapsed)
        return blocks

    async def _repair(self, tier: str, keys: list[bytes]) -> None:
        """The ledger claimed pages the tier could not produce: correct the ledger."""
        self.counters[f"repaired_{tier}"] += len(keys)
        if self.ledger is None:
            return
        try:
            await asyncio.wait_for(
                self.ledger.drop(keys, NAS if tier == "nas" else OBJECT),
                self.config.ledger_timeout_s,
            )
        except Exception as exc:
            self.failures.record("ledger", "repair", exc)

    def prefetch(
        self, namespace: bytes, keys: Sequence[bytes], tokens_per_page: int, *, page_bytes: int
    ) -> bool:
        """Start pulling ``keys``' prefix into host RAM in the background; False if too busy."""
        if len(self._prefetches) >= self.config.max_prefetches:
            self.counters["prefetch_dropped"] += 1
            return False
        task = asyncio.create_task(
            self.fetch(namespace, keys, tokens_per_page, page_bytes=page_bytes)
        )
        self._prefetches.add(task)
        task.add_done_callback(self._prefetches.discard)
        return True

    # --- observability ------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Everything /metrics needs: per-tier counters, store counters, failures, cost model."""
        return {
            "tiers": {name: tier.stats() for name, tier in self.tiers.items()},
            "store": dict(self.counters),
            "fetch_seconds": dict(self.fetch_seconds),
            "failures": {f"{t}.{k}": n for (t, k), n in self.failures.counts.items()},
            "write_queue": self._queue.qsize(),
            "cost": self.cost.snapshot(),
        }
