"""Torch adapter: the engine's :class:`~workers.engine.offload.KVOffload` over the tiered store.

The engine calls this object on its scheduler thread; the tiered store lives on an event
loop of its own, on a thread of its own (its asyncpg pool and S3 client belong to that
loop). Offered pages (with write-through, as soon as the engine caches them; otherwise when
it evicts them) are keyed, copied to host bytes and handed over without waiting. A request
that must queue has its pages fetched from then on (:meth:`TieredOffload.fetch_early`),
and its admission lands them from memory. An admission lookup blocks the scheduler for at
most ``fetch_timeout_s``; after that the
fetch is abandoned and the engine simply recomputes. Nothing raised below the engine ever
reaches it: a failure is a miss.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import torch

from tiering import cold_storage
from tiering.codec import Block, make_block
from tiering.keys import Namespace, chain_keys, page_keys
from tiering.landing import Landing
from tiering.store import TieredStore
from workers.engine.kv_pool import KVLayout, RestoreTarget
from workers.engine.offload import OffloadPage, Restored

#: how long an abandoned restore's reads in flight are waited for before their pages are
#: held back (a healthy NAS finishes a page read in well under this)
LATE_GRACE_S = 0.05

#: how long sending one namespace down to cold storage may take (writes of every page)
SEND_DOWN_TIMEOUT_S = 120.0

_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


class TieredOffload:
    """Evicted pages go down the tier ladder; admissions fetch prefixes back up."""

    def __init__(
        self,
        build_store: Callable[[], Awaitable[TieredStore]],
        *,
        model_fingerprint: str,
        layout: KVLayout,
        compute: str,
        fetch_timeout_s: float = 5.0,
        prefill_stats: Callable[[], tuple[int, float]] | None = None,
        write_through: bool = True,
    ) -> None:
        """``build_store`` runs on the store's own loop (so its pools belong there).

        ``compute`` says how the engine computes the KV it hands over, its compute dtype and
        device type (:func:`tiering.keys.compute_tag`); like ``model_fingerprint`` and ``layout`` it
        scopes every key, so engines that would recompute other bytes never share pages.
        ``prefill_stats`` returns the engine's cumulative ``(prefill tokens, seconds)``;
        the cost model learns the recompute rate from it. ``write_through`` asks the engine
        for pages as soon as it caches them, so that every worker on these tiers can resume
        a conversation at once, not only after this one evicted it.
        """
        if layout.dtype not in _TORCH_DTYPES:
            raise ValueError(f"cannot offload KV of dtype {layout.dtype!r}")
        if not compute:
            raise ValueError("compute is required: the engine's compute dtype and device type")
        self.layout = layout
        self.model_fingerprint = model_fingerprint
        self.compute = compute
        self.fetch_timeout_s = fetch_timeout_s
        self.write_through = write_through
        self._prefill_stats = prefill_stats
        self._prefill_seen = (0, 0.0)
        self._namespaces: dict[str, Namespace] = {}
        self._page_bytes = int(np.prod(layout.page_shape)) * _itemsize(layout.dtype)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kv-tiers", daemon=True)
        self._thread.start()
        self.store: TieredStore = self._call(self._start(build_store), timeout=120)

    async def _start(self, build: Callable[[], Awaitable[TieredStore]]) -> TieredStore:
        return await (await build()).start()

    def _call(self, coro: Awaitable[Any], timeout: float) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def namespace(self, cache_salt: str) -> Namespace:
        """The key namespace of a tenant's cache salt on this model, KV layout and compute."""
        ns = self._namespaces.get(cache_salt)
        if ns is None:
            lay = self.layout
            shape = "x".join(str(d) for d in lay.page_shape)
            ns = Namespace(
                tenant=cache_salt,
                model=self.model_fingerprint,
                dtype=lay.dtype,
                page_size=lay.page_size,
                layout=f"{lay.layout}:{shape}",
                compute=self.compute,
            )
            self._namespaces[cache_salt] = ns
        return ns

    # --- KVOffload ------------------------------------------------------------------------
    def offer(self, pages: list[OffloadPage]) -> None:
        """Key the pages, copy their KV to host bytes and queue them; never blocks."""
        try:
            blocks, owned = self._blocks(pages)
        except Exception as exc:  # a bug here must cost cache hits, not the engine
            self.store.failures.record("offload", "offer", exc)
            return
        self._loop.call_soon_threadsafe(functools.partial(self.store.offer, blocks, owned=owned))

    def _blocks(self, pages: list[OffloadPage]) -> tuple[list[Block], bool]:
        """The pages as blocks over host copies of their KV, and whether each block's payload
        is memory of its own (see :func:`_host_copies`)."""
        ps = self.layout.page_size
        kv, private = _host_copies(pages)
        for page in kv:
            if (
                page.dtype != _TORCH_DTYPES[self.layout.dtype]
                or page.shape != self.layout.page_shape
            ):
                raise ValueError(
                    f"offered KV is {page.dtype} {tuple(page.shape)}, the tiers hold "
                    f"{self.layout.dtype} {self.layout.page_shape}"
                )
        keys = chain_keys([(self.namespace(p.namespace).digest, p.token_ids) for p in pages], ps)
        blocks = [
            make_block(
                key,
                self.namespace(p.namespace).digest,
                self.layout.dtype,
                tuple(p.kv.shape),
                page.view(-1).view(torch.uint8).numpy(),
            )
            for p, key, page in zip(pages, keys, kv, strict=True)
        ]
        return blocks, private

    def touch(self, namespace: str, token_ids: Sequence[int], n_pages: int) -> None:
        """Under write-through, note a use of the first ``n_pages`` pages in the ledger, as a
        restore would: tierd demotes, and deletes for retention and quotas, the least
        recently used pages first, and a conversation served from L1 is not idle."""
        if not self.write_through or n_pages <= 0:
            return
        ps = self.layout.page_size
        try:
            keys = page_keys(self.namespace(namespace).digest, token_ids[: n_pages * ps], ps)
        except Exception as exc:  # a bug here must cost recency, not the engine
            self.store.failures.record("offload", "touch", exc)
            return
        self._loop.call_soon_threadsafe(self.store.touch, keys)

    def fetch_early(
        self, namespace: str, token_ids: Sequence[int], start_page: int, end_page: int
    ) -> None:
        """Key pages ``start_page`` to ``end_page`` and start fetching them (see
        :meth:`~tiering.store.TieredStore.fetch_early`); never blocks."""
        ps = self.layout.page_size
        try:
            digest = self.namespace(namespace).digest
            keys = page_keys(digest, token_ids[: end_page * ps], ps)[start_page:]
        except Exception as exc:  # a bug here must cost the head start, not the engine
            self.store.failures.record("offload", "fetch_early", exc)
            return
        start = functools.partial(self.store.fetch_early, page_bytes=self._page_bytes)
        self._loop.call_soon_threadsafe(start, digest, keys, ps)

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, target: RestoreTarget
    ) -> Restored:
        """Fetch consecutive pages from ``start_page`` into ``target``, within the timeout.

        The pages land in the target's memory straight from the tiers (see
        :class:`~tiering.landing.Landing`). Whatever happens, no read writes that memory
        after this returns, except pages reported ``late``, which the pool holds back.
        """
        if target.pool.layout != self.layout:  # bytes of another shape or dtype: never load
            self.store.failures.record(
                "offload", "load", f"pool layout {target.pool.layout} is not {self.layout}"
            )
            return Restored()
        ns = self.namespace(namespace)
        ps = self.layout.page_size
        chain = page_keys(ns.digest, token_ids[: (start_page + len(target.page_ids)) * ps], ps)
        if self.write_through and start_page:
            # the chain holds the device prefix's keys too: note its use here (see touch)
            self._loop.call_soon_threadsafe(self.store.touch, chain[:start_page])
        keys = chain[start_page:]
        if not keys:
            return Restored()
        self._learn_prefill_rate()
        landing = Landing(ns.digest, self.layout.dtype, self.layout.page_shape, target.views)
        coro = self.store.fetch(ns.digest, keys, ps, page_bytes=self._page_bytes, into=landing)
        try:
            tiers = tuple(self._call(coro, self.fetch_timeout_s).tiers)
        except Exception as exc:  # timeout or a bug: recompute
            self.store.failures.record("offload", "load", exc)
            tiers = ()
        late: set[int] = set()
        if target.in_pool:  # a late write into a staging buffer harms nobody
            late = landing.close(LATE_GRACE_S, lambda i: target.pool.hold_back(target.page_ids[i]))
        else:
            landing.close()
        if late:
            self.store.failures.record("offload", "late", f"{len(late)} pages still being read")
        target.commit(len(tiers))
        return Restored(tiers, frozenset(late))

    def send_down(self, namespace: str, pages: list[OffloadPage], tier: str) -> cold_storage.Moved:
        """Write ``pages`` and the namespace's host RAM pages to ``tier``, then drop them
        from host RAM (see :mod:`tiering.cold_storage`); blocks up to ``SEND_DOWN_TIMEOUT_S``."""
        blocks = self._blocks(pages)[0] if pages else []
        digest = self.namespace(namespace).digest
        return self._call(
            cold_storage.send_down(self.store, digest, blocks, tier), SEND_DOWN_TIMEOUT_S
        )

    def _learn_prefill_rate(self) -> None:
        if self._prefill_stats is None:
            return
        tokens, seconds = self._prefill_stats()
        d_tok, d_sec = tokens - self._prefill_seen[0], seconds - self._prefill_seen[1]
        self._prefill_seen = (tokens, seconds)
        if d_tok > 0 and d_sec > 0:
            self._loop.call_soon_threadsafe(self.store.cost.observe_prefill, d_tok, d_sec)

    # --- observability and shutdown ---------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The store's counters (per tier hits, bytes, latencies, drops, corruptions)."""

        async def snapshot() -> dict[str, Any]:
            return self.store.stats()

        return self._call(snapshot(), timeout=5)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued write-behind pages have reached the NAS."""
        self._call(self.store.drain(), timeout)

    def close(self) -> None:
        """Write what is queued, close the store and stop its thread."""
        try:
            self._call(self.store.close(), timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def _host_copies(pages: Sequence[OffloadPage]) -> tuple[list[torch.Tensor], bool]:
    """The pages' KV in host memory, contiguous, and whether each is memory of its own.

    Pages in host memory are the pool's copies made for the offload
    (:meth:`~workers.engine.kv_pool.KVPool.page_copies`), one per page: host RAM keeps
    them as they are and frees them page by page. Pages on a device are views of one
    gathered buffer, stacked into one transfer; host RAM copies those into its own memory.
    """
    if all(p.kv.device.type == "cpu" for p in pages):
        return [p.kv.contiguous() for p in pages], True
    return list(torch.stack([p.kv for p in pages]).to("cpu").unbind()), False


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=_TORCH_DTYPES[dtype]).element_size()
