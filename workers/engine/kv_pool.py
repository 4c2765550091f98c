"""The paged KV pool: the "VRAM" tier, one preallocated tensor carved into fixed-size pages.

A page holds ``page_size`` consecutive tokens of K and V for every layer. The pool only
hands out page ids and moves bytes; which tokens a page holds is the radix cache's and the
scheduler's business. Storage is page-major (``[pages, layers, page_size, 2, kv_heads,
head_dim]``): a page is one contiguous run of bytes in the tier layout
``layer,token,kv,head,dim``, so a page leaves the pool as one copy and a restore reads a
file (or copies a block) straight into it in one piece, verifying its checksum over
contiguous memory. Layer-major storage made a page 30 runs of 12 KiB for SmolLM2: a NAS
landing of 258 pages read and hashed 7,740 small pieces, 11.3 ms against 10.0 page-major
(2-core AMD EPYC, the same files in the page cache, median of 15), and on the Xeon of
earlier runs hashing 30 views a page did not run in parallel on two threads at all.

Attention still reads one layer at a time through a slot view per layer
(:attr:`KVPool.layer_slots`): layer ``l``'s view starts ``l * page_size`` rows into the
pool, so token ``o`` of page ``p`` is row ``p * page_stride + o`` of every layer's view,
with ``page_stride = layers * page_size`` (see :func:`~workers.engine.batch.build_batch`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from workers.engine.config import ModelConfig

#: Axis order of one exported page (after the leading page axis); tiering folds it into keys.
PAGE_LAYOUT = "layer,token,kv,head,dim"


class PoolExhausted(RuntimeError):
    """Raised when more pages are requested than are free; free or evict some first."""


@dataclass(frozen=True)
class KVLayout:
    """What must match for an exported page to be importable elsewhere."""

    dtype: str
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layout: str = PAGE_LAYOUT

    @property
    def page_shape(self) -> tuple[int, ...]:
        """Shape of one exported page."""
        return (self.num_layers, self.page_size, 2, self.num_kv_heads, self.head_dim)


class KVPool:
    """A fixed number of KV pages in one tensor, with a free list."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        pool_bytes: int,
        page_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        page_bytes = config.kv_bytes_per_token(itemsize) * page_size
        num_pages = pool_bytes // page_bytes
        if num_pages < 2:
            raise ValueError(
                f"kv_pool_bytes={pool_bytes} holds {num_pages} pages of {page_bytes} bytes; "
                f"raise it to at least {2 * page_bytes}"
            )
        self.page_size = page_size
        self.num_pages = int(num_pages)
        self.page_bytes = page_bytes
        self.layout = KVLayout(
            dtype=str(dtype).removeprefix("torch."),
            page_size=page_size,
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
        )
        L, H, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        self.kv = torch.zeros(self.num_pages, L, page_size, 2, H, D, dtype=dtype, device=device)
        #: slot rows from one page to the next in a layer's view (a page holds every layer)
        self.page_stride = L * page_size
        rows = self.kv.view(-1, 2, H, D)
        #: per layer, a view of rows ``[2, kv_heads, head_dim]`` in which token ``o`` of page
        #: ``p`` is row ``p * page_stride + o``
        self.layer_slots = [rows[i * page_size :] for i in range(L)]
        # Pop from the end: low page ids go out first, which keeps test output readable.
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))
        #: pages an abandoned restore may still write (see :meth:`hold_back`), and those
        #: whose writes have ended since, to be put back on the free list
        self.held_back = 0
        #: pages ever held back (with ``held_back``, tells one set of pages out from another)
        self.holds = 0
        self._returned: collections.deque[int] = collections.deque()
        self._given_back = threading.Event()
        self._bytes: memoryview | None = None  # a CPU pool's storage as bytes, made on demand

    # --- accounting -------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        self._take_returned()
        return len(self._free)

    @property
    def used_pages(self) -> int:
        """Pages in use or held back. Safe to read from any thread, as ``load()`` does from
        the event loop's: it changes nothing, whereas everything else here belongs to the
        engine's thread (a free list changed under :meth:`alloc` hands one page out twice)."""
        return self.num_pages - len(self._free) - len(self._returned)

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free pages; raises :class:`PoolExhausted` (taking none) if fewer are free."""
        self._take_returned()
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} pages, {len(self._free)} free")
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        return taken[::-1]

    def free(self, page_ids: Sequence[int]) -> None:
        """Return pages to the free list."""
        self._free.extend(page_ids)

    # --- export / import for tiering ------------------------------------------------------------
    def page_copies(self, page_ids: Sequence[int]) -> list[torch.Tensor]:
        """A copy of each page's KV, ``[layers, page_size, 2, kv_heads, head_dim]``.

        On a CPU each copy is memory of its own, which host RAM can keep as it is and free
        page by page, all copied in one op: a clone per page gave up the GIL and waited to
        get it back once per page, behind the event loop's thread (100 clones beside a busy
        Python thread took 72 ms, one op over the same pages 20). On a device the pages are
        gathered in one kernel and come as views of one buffer, which the offload moves to
        the host in one transfer.
        """
        if self.kv.device.type == "cpu":
            copies = [torch.empty(self.kv.shape[1:], dtype=self.kv.dtype) for _ in page_ids]
            if copies:  # the op refuses empty lists
                torch._foreach_copy_(copies, [self.kv[p] for p in page_ids])
            return copies
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        return list(self.kv.index_select(0, idx).unbind())

    def write_pages(self, page_ids: Sequence[int], pages: torch.Tensor) -> None:
        """Store ``pages`` (``[n, layers, page_size, 2, kv_heads, head_dim]``, the
        :meth:`page_copies` stacked) into ``page_ids``."""
        if len(pages) != len(page_ids):
            raise ValueError(f"{len(pages)} pages of KV for {len(page_ids)} page ids")
        if tuple(pages.shape[1:]) != self.layout.page_shape:
            raise ValueError(
                f"pages have shape {tuple(pages.shape[1:])}, expected {self.layout.page_shape}"
            )
        if not page_ids:
            return
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        src = pages.to(device=self.kv.device, dtype=self.kv.dtype, non_blocking=pages.is_pinned())
        self.kv.index_copy_(0, idx, src)

    def restore_target(self, page_ids: Sequence[int]) -> RestoreTarget:
        """Memory a restore of ``page_ids`` writes each page's bytes into (tier layout).

        A CPU pool offers the pages themselves, one run of bytes each, so a page read from a
        file lands where attention reads it. A device pool offers one
        page-locked staging tensor, moved into the slots in one transfer by
        :meth:`RestoreTarget.commit`.
        """
        if self.kv.device.type == "cpu":
            if self._bytes is None:
                self._bytes = memoryview(self.kv.view(torch.uint8).numpy()).cast("B")
            return RestoreTarget(self, page_ids, _PageViews(self, page_ids), staging=None)
        staging = torch.empty(
            (len(page_ids), *self.layout.page_shape),
            dtype=self.kv.dtype,
            pin_memory=self.kv.device.type == "cuda",
        )
        flat = memoryview(staging.view(torch.uint8).numpy()).cast("B")
        pb = self.page_bytes
        views = [[flat[i * pb : (i + 1) * pb]] for i in range(len(page_ids))]
        return RestoreTarget(self, page_ids, views, staging=staging)

    def hold_back(self, page_id: int) -> Callable[[], None]:
        """Keep ``page_id`` out of circulation until the returned callable runs (on any
        thread): a restore abandoned at its deadline may still be writing into it."""
        self.held_back += 1
        self.holds += 1

        def give_back() -> None:
            self._returned.append(page_id)  # deque appends are thread-safe
            self._given_back.set()

        return give_back

    def wait_given_back(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a held-back page to be given back."""
        self._given_back.wait(timeout)
        self._given_back.clear()

    def _take_returned(self) -> None:
        while self._returned:
            self._free.append(self._returned.popleft())
            self.held_back -= 1


class _PageViews(Sequence[list[memoryview]]):
    """Per page, its bytes in a CPU pool (one run), made when asked for."""

    def __init__(self, pool: KVPool, page_ids: Sequence[int]) -> None:
        assert pool._bytes is not None
        self._bytes = pool._bytes
        self._page_ids = list(page_ids)
        self._size = pool.page_bytes

    def __len__(self) -> int:
        return len(self._page_ids)

    def __getitem__(self, i: int) -> list[memoryview]:  # type: ignore[override]
        start = self._page_ids[i] * self._size
        return [self._bytes[start : start + self._size]]


class RestoreTarget:
    """Where a restore writes pages (see :meth:`KVPool.restore_target`)."""

    def __init__(
        self,
        pool: KVPool,
        page_ids: Sequence[int],
        views: Sequence[list[memoryview]],
        staging: torch.Tensor | None,
    ) -> None:
        self.pool = pool
        self.page_ids = list(page_ids)
        #: per page, its memory in payload order
        self.views = views
        self._staging = staging

    @property
    def in_pool(self) -> bool:
        """Whether the views are the pool's own memory (a late write would corrupt it)."""
        return self._staging is None

    def commit(self, n: int) -> None:
        """Make the first ``n`` pages written into the views the pool's pages."""
        if self._staging is not None and n:
            self.pool.write_pages(self.page_ids[:n], self._staging[:n])
