"""The paged KV pool: the "VRAM" tier, one preallocated tensor carved into fixed-size pages.

A page holds ``page_size`` consecutive tokens of K and V for every layer. The pool only
hands out page ids and moves bytes; which tokens a page holds is the radix cache's and the
scheduler's business. Storage is layer-major (``[layers, pages, page_size, 2, kv_heads,
head_dim]``) so that one layer's attention gathers rows of one contiguous block. Pages
leave and enter the pool in the tier layout ``layer,token,kv,head,dim``: per layer, the
bytes of the page's slot exactly as the pool holds them, so a restore can read a page
straight into a CPU pool (one contiguous run per layer) with nothing to reorder.
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
        self.kv = torch.zeros(L, self.num_pages, page_size, 2, H, D, dtype=dtype, device=device)
        #: per layer, a ``[pages * page_size, 2, kv_heads, head_dim]`` view: one row per token slot
        self.layer_slots = [self.kv[i].view(-1, 2, H, D) for i in range(L)]
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
        page by page: one copy per page, 5.8 ms for 130 pages of SmolLM2 here, where one
        ``index_select`` over the page axis, transposed to pages first, took 38. On a device
        the pages are gathered in one kernel and come as views of one buffer, which the
        offload moves to the host in one transfer.
        """
        if self.kv.device.type == "cpu":
            return [self.kv[:, p].clone(memory_format=torch.contiguous_format) for p in page_ids]
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        return list(self.kv.index_select(1, idx).transpose(0, 1).contiguous().unbind())

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
        self.kv.index_copy_(1, idx, src.transpose(0, 1))

    def restore_target(self, page_ids: Sequence[int]) -> RestoreTarget:
        """Memory a restore of ``page_ids`` writes each page's bytes into (tier layout).

        A CPU pool offers the pages' slots themselves — one run of bytes per layer — so a
        page read from a file lands where attention reads it. A device pool offers one
        page-locked staging tensor, moved into the slots in one transfer by
        :meth:`RestoreTarget.commit`.
        """
        if self.kv.device.type == "cpu":
            if self._bytes is None:
                self._bytes = memoryview(self.kv.view(torch.uint8).numpy()).cast("B")
            return RestoreTarget(self, page_ids, _SlotViews(self, page_ids), staging=None)
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


class _SlotViews(Sequence[list[memoryview]]):
    """Per page, the runs of bytes of its slot in a CPU pool (one per layer), made when
    asked for: a 7k-token restore would otherwise build thousands of views up front."""

    def __init__(self, pool: KVPool, page_ids: Sequence[int]) -> None:
        assert pool._bytes is not None
        self._bytes = pool._bytes
        self._page_ids = list(page_ids)
        self._slot = pool.page_bytes // pool.layout.num_layers
        self._stride = pool.num_pages * self._slot  # from a layer's slot to the next layer's
        self._layers = pool.layout.num_layers

    def __len__(self) -> int:
        return len(self._page_ids)

    def __getitem__(self, i: int) -> list[memoryview]:  # type: ignore[override]
        start = self._page_ids[i] * self._slot
        return [
            self._bytes[start + layer * self._stride : start + layer * self._stride + self._slot]
            for layer in range(self._layers)
        ]


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
