"""Our tiers as SGLang's HiCache storage backend (L3): NAS, object store and ledger.

SGLang (0.5.23) loads this class with ``--hicache-storage-backend dynamic`` and the extra
config that :mod:`tiering.sglang.options` describes. Pages land on the shared NAS through
the same :class:`~tiering.store.TieredStore` the built-in engine uses (opened by
:mod:`tiering.sglang.store`) — same block codec and checksums, same ledger rows, same
tierd demotion to the object store — so any worker can resume a conversation another one
served.

Threading: SGLang calls the backend synchronously from its prefetch, backup and scheduler
threads at once. The tiered store is asyncio code, so it lives on a private event loop in
a thread of its own; each call is marshalled there and waited for with a deadline. A call
that overruns its deadline, or fails in any way, answers "miss" / "not stored" and is
counted: nothing ever raises into SGLang's threads, and SGLang simply recomputes.

Keys: SGLang names a page by a chained SHA-256 hex string that already covers the request's
``extra_key``/``cache_salt`` (so tenants never share a page). We fold it with the digest of
a :class:`~tiering.keys.Namespace` made of the content fingerprint of the weights (computed
by the launcher: a served name alone says nothing of the checkpoint behind it), the launch
flags that change the numbers those weights compute (``--dtype``, ``--quantization``, ...),
the served name, the tensor-parallel shard, the KV dtype, the host-pool layout and its
storage format tag, and the page size, so that pages of different weights, computations,
formats or shards can never be confused. Both of SGLang's interfaces store the same page
bytes (see :mod:`tiering.sglang.pages`).

This is an adapter, so torch is allowed here (the tiering core stays torch-free).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolTransferResult,
)

from tiering.codec import DTYPE_SIZES, Block, make_block
from tiering.failures import FailureLog
from tiering.keys import Namespace
from tiering.sglang.loop import LoopThread, never_raises
from tiering.sglang.options import SGLangBackendOptions
from tiering.sglang.pages import PageBuffers, gather, page_buffers, scatter
from tiering.sglang.store import open_store

log = logging.getLogger("kvgate.tiering.sglang")

#: Seconds allowed for opening the tiers and the ledger pool when SGLang attaches us.
_OPEN_TIMEOUT_S = 30.0


def _misses(self: Any, keys: Sequence[str], *_: Any) -> list[Any]:
    return [None] * len(keys)


def _falses(self: Any, keys: Sequence[str], *_: Any) -> list[bool]:
    return [False] * len(keys)


class KvgateHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage on kvgate's NAS + object store + ledger; see the module docstring."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        # SGLang's dynamic factory calls ``cls(storage_config, kwargs)``.
        self.storage_config = storage_config
        self.options = SGLangBackendOptions.from_extra_config(storage_config.extra_config)
        self.weights_fingerprint = self.options.checked_weights_fingerprint()
        self.failures = FailureLog()
        self._counters: Counter[str] = Counter()
        self._counters_lock = threading.Lock()
        self._namespace: Namespace | None = None
        self._page_tokens = 0
        self._page_bytes = 0
        self._metrics: dict[str, list[float]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }
        self._rt = LoopThread("kvgate-sglang-tiers")
        try:
            self._store = self._rt.call(open_store(self.options, self.failures), _OPEN_TIMEOUT_S)
        except BaseException:
            self._rt.stop()
            raise

    # --- scope ------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learn the page geometry from SGLang's host pool; this completes the namespace."""
        super().register_mem_pool_host(mem_pool_host)
        c = self.storage_config
        dtype = str(mem_pool_host.dtype).removeprefix("torch.")
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"KV dtype {dtype} is not storable; use one of {sorted(DTYPE_SIZES)}")
        # MLA KV is identical on every TP rank, so those ranks share pages.
        shard = "" if c.is_mla_model else f";tp={c.tp_rank}/{c.tp_size}"
        if c.pp_size > 1:
            shard += f";pp={c.pp_rank}/{c.pp_size}"
        if c.attn_cp_size > 1:  # context parallel: each rank holds a slice of every page
            shard += f";cp={c.attn_cp_rank}/{c.attn_cp_size}"
        dcp = getattr(c, "dcp_size", 1)
        if dcp > 1:  # decode context parallel (MLA): each DCP rank holds a slice too
            page = getattr(c, "logical_page_size", None)
            shard += f";dcp={c.dcp_rank}/{dcp};tp={c.tp_size};page={page}"
        self._page_tokens = mem_pool_host.page_size
        self._page_bytes = mem_pool_host.get_size_per_token() * mem_pool_host.page_size
        # A host pool with a page format of its own (SGLang's unified pool) stores other
        # bytes for the same geometry; SGLang tags its storage name with it, and so do we.
        tag = getattr(mem_pool_host, "storage_format_tag", None)
        fmt = f";format={tag}" if tag else ""
        self._dtype = dtype
        self._namespace = Namespace(
            tenant="sglang",
            model=f"{self.weights_fingerprint};name={self.options.model or c.model_name or ''}",
            dtype=dtype,
            page_size=mem_pool_host.page_size,
            layout=f"sglang:{mem_pool_host.layout}{fmt}{shard}",
            compute=self.options.compute,
        )

    @property
    def namespace(self) -> Namespace:
        """The scope of every page this backend stores (set by ``register_mem_pool_host``)."""
        if self._namespace is None:
            raise RuntimeError("register_mem_pool_host has not been called yet")
        return self._namespace

    def scoped_key(self, key: str) -> bytes:
        """Our 32-byte key for SGLang's page key ``key`` in this backend's namespace."""
        return hashlib.sha256(self.namespace.digest + key.encode()).digest()

    # --- existence ------------------------------------------------------------------------------
    @never_raises(lambda self, keys, *a: 0)
    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many leading ``keys`` are stored (in this process, or on NAS/S3 per the ledger)."""
        if not keys:
            return 0
        scoped = [self.scoped_key(k) for k in keys]
        plan = self._rt.call(
            self._store.lookup(self.namespace.digest, scoped), self.options.exists_deadline_s
        )
        return len(plan)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- reads ------------------------------------------------------------------------------------
    def _fetch(self, keys: Sequence[str]) -> list[Block]:
        """The verified blocks of the longest readable prefix of ``keys``."""
        start = time.perf_counter()
        fetched = self._rt.call(
            self._store.fetch(
                self.namespace.digest,
                [self.scoped_key(k) for k in keys],
                self._page_tokens,
                page_bytes=self._page_bytes,
            ),
            self.options.get_deadline_s,
        )
        # A page of the wrong size (another geometry under a colliding name) ends the prefix.
        blocks = list(itertools.takewhile(lambda b: b.nbytes == self._page_bytes, fetched.blocks))
        self.count("pages_read", len(blocks))
        self.count("pages_missed", len(keys) - len(blocks))
        self._observe("prefetch", len(blocks), time.perf_counter() - start)
        return blocks

    @never_raises(lambda self, key, *a: None)
    def get(
        self, key: str, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> torch.Tensor | None:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    @never_raises(_misses)
    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None]:
        """Pages into ``target_locations`` (flat host pages), or new tensors; None past a miss."""
        out: list[torch.Tensor | None] = [None] * len(keys)
        for i, block in enumerate(self._fetch(keys)):
            src = np.frombuffer(block.payload, dtype=np.uint8)
            if target_locations is None:
                out[i] = torch.frombuffer(bytearray(src), dtype=getattr(torch, self._dtype))
                continue
            dst = target_locations[i]
            flat = dst.view(torch.uint8).reshape(-1).numpy()
            if not dst.is_contiguous() or flat.nbytes != src.nbytes:
                break  # SGLang hands contiguous flat pages; anything else would be lost
            flat[:] = src
            out[i] = dst
        return out

    @never_raises(_falses)
    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Zero-copy read: each verified page is copied straight into SGLang's host pool."""
        pages = self._page_buffers(keys, host_indices)
        blocks = self._fetch(keys)
        for block, buffers in zip(blocks, pages, strict=False):
            scatter(block.payload, buffers)
        return [i < len(blocks) for i in range(len(keys))]

    # --- writes ------------------------------------------------------------------------------------
    def _offer(self, keys: Sequence[str], payloads: Sequence[bytearray | bytes]) -> list[bool]:
        """Hand pages to the store, which writes them behind to the NAS and the ledger.

        Never blocks on the NAS: a full write queue drops pages (counted), and a page is
        visible to ``batch_exists`` once written (or at once, with ``host_bytes``).
        """
        start = time.perf_counter()
        ns = self.namespace
        blocks = [
            make_block(
                self.scoped_key(k), ns.digest, self._dtype, (len(p) // DTYPE_SIZES[self._dtype],), p
            )
            for k, p in zip(keys, payloads, strict=True)
        ]

        async def offer() -> int:
            # offer() runs without yielding, so once the queue is full every later page of
            # the batch is dropped too: the dropped pages are the batch's tail.
            before = self._store.counters["write_dropped"]
            self._store.offer(blocks)
            return self._store.counters["write_dropped"] - before

        dropped = self._rt.call(offer(), self.options.set_deadline_s)
        accepted = len(blocks) - dropped
        self.count("pages_written", accepted)
        self.count("pages_dropped", dropped)
        self._observe("backup", accepted, time.perf_counter() - start)
        return [True] * accepted + [False] * dropped

    @never_raises(lambda self, key, *a: False)
    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        return self.batch_set([key], [value])

    @never_raises(lambda self, keys, *a: False)
    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store flat host pages (tensors) under ``keys``; True when all were accepted."""
        payloads = [v.detach().contiguous().view(torch.uint8).numpy().tobytes() for v in values]
        if any(len(p) != self._page_bytes for p in payloads):
            raise ValueError(f"a page must be {self._page_bytes} bytes, one of these is not")
        return all(self._offer(keys, payloads))

    @never_raises(_falses)
    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Zero-copy write: each page is copied once, straight out of SGLang's host pool."""
        pages = self._page_buffers(keys, host_indices)
        return self._offer(keys, [gather(buffers, self._page_bytes) for buffers in pages])

    def _page_buffers(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[PageBuffers]:
        return page_buffers(
            self.mem_pool_host,
            host_indices,
            len(keys),
            is_mla=self.storage_config.is_mla_model,
            page_bytes=self._page_bytes,
        )

    # --- hybrid models (per-pool v2 interface) ---------------------------------------------------
    # Mamba/SWA/DSA models keep extra pools that SGLang stores through the v2 calls. They are
    # not supported yet: answer "nothing stored" so such a model runs without L3 hits (its
    # pages are recomputed) instead of failing in SGLang's threads.
    def batch_exists_v2(
        self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> PoolTransferResult:
        self._warn_v2()
        return PoolTransferResult.empty()

    def batch_get_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[str, list[bool]]:
        self._warn_v2()
        return {t.name: [False] * len(t.keys or []) for t in transfers}

    batch_set_v2 = batch_get_v2

    def _warn_v2(self) -> None:
        if not self._counters["v2_calls"]:
            log.warning("hybrid-model pools (v2 storage calls) are not stored by kvgate yet")
        self.count("v2_calls")

    # --- housekeeping -----------------------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every page handed over so far has reached the NAS (and its ledger row)."""
        self._rt.call(self._store.drain(), timeout)

    def clear(self) -> bool:
        """Drop the pages kept in this process (``host_bytes``).

        Pages on the shared NAS and object store belong to every worker: removing them is
        tierd's job (capacity, retention, quotas), never one worker's.
        """
        try:
            self._rt.call(self._clear_host(), self.options.set_deadline_s)
            return True
        except Exception as exc:
            self.failures.record("sglang", "clear", exc)
            return False

    async def _clear_host(self) -> None:
        self._store.host.clear()

    @never_raises(lambda self, *a: None)
    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` since the previous call (pages and GB/s per operation)."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._counters_lock:
            snapshot = {name: list(values) for name, values in self._metrics.items()}
            for values in self._metrics.values():
                values.clear()
        return StorageMetrics(**snapshot)

    def stats(self) -> dict[str, Any]:
        """Our own counters: per-operation page counts, failures, and the store's tier stats."""
        with self._counters_lock:
            counters = dict(self._counters)
        failures = {f"{t}.{k}": n for (t, k), n in self.failures.counts.items()}
        try:
            store = self._rt.call(self._store_stats(), self.options.exists_deadline_s)
        except Exception:
            store = {}
        return {"backend": counters, "failures": failures, "store": store}

    async def _store_stats(self) -> dict[str, Any]:
        return self._store.stats()

    def close(self) -> None:
        """Write out what is queued (bounded by ``set_deadline_s``), then release everything."""
        try:
            self._rt.call(self._close(), self.options.set_deadline_s + 5)
        except Exception as exc:
            self.failures.record("sglang", "close", exc)
        finally:
            self._rt.stop()

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self._store.drain(), self.options.set_deadline_s)
        finally:
            await self._store.close(drain=False)  # also closes the S3 client and ledger pool

    # --- counters ------------------------------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n

    def _observe(self, op: str, pages: int, seconds: float) -> None:
        if not pages or not self.storage_config.enable_storage_metrics:
            return
        with self._counters_lock:
            self._metrics[f"{op}_pgs"].append(pages)
            self._metrics[f"{op}_bandwidth"].append(
                pages * self._page_bytes / max(seconds, 1e-9) / 1e9
            )
