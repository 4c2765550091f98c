"""The paged KV pool: the "VRAM" tier, one preallocated tensor carved into fixed-size pages.

A page holds ``page_size`` consecutive tokens of K and V for every layer. The pool only
hands out page ids and moves bytes; which tokens a page holds is the radix cache's and the
scheduler's business. Storage is layer-major (``[layers, pages, page_size, 2, kv_heads,
head_dim]``) so that one layer's attention gathers rows of one contiguous block; pages
leave and enter the pool in the tier layout ``layer,kv,token,head,dim`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workers.engine.config import ModelConfig

#: Axis order of one exported page (after the leading page axis); tiering folds it into keys.
PAGE_LAYOUT = "layer,kv,token,head,dim"


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
        return (self.num_layers, 2, self.page_size, self.num_kv_heads, self.head_dim)


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

    # --- accounting -------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free pages; raises :class:`PoolExhausted` (taking none) if fewer are free."""
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
    def read_pages(self, page_ids: Sequence[int]) -> torch.Tensor:
        """A contiguous copy ``[n, layers, 2, page_size, kv_heads, head_dim]`` of the pages."""
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        # [L, n, P, 2, H, D] -> [n, L, 2, P, H, D]
        return self.kv.index_select(1, idx).permute(1, 0, 3, 2, 4, 5).contiguous()

    def write_pages(
        self, page_ids: Sequence[int], pages: torch.Tensor | Sequence[torch.Tensor]
    ) -> None:
        """Store ``pages`` into ``page_ids``: one tensor as :meth:`read_pages` returns, or a
        sequence of single pages (``[layers, 2, page_size, kv_heads, head_dim]`` each).

        Single pages are what a restore yields (views of the tiers' read buffers). A CPU
        pool copies each straight into its slot, so the restored bytes are copied once; a
        device pool gathers them into one page-locked staging tensor and moves that in one
        transfer, instead of one small pageable copy per page.
        """
        if len(pages) != len(page_ids):
            raise ValueError(f"{len(pages)} pages of KV for {len(page_ids)} page ids")
        if not page_ids:
            return
        if isinstance(pages, torch.Tensor):
            self._check_shape(tuple(pages.shape[1:]))
            self._write_stacked(page_ids, pages)
            return
        for page in pages:
            self._check_shape(tuple(page.shape))
        if self.kv.device.type != "cpu":
            staging = torch.empty(
                (len(pages), *self.layout.page_shape),
                dtype=pages[0].dtype,
                pin_memory=self.kv.device.type == "cuda",
            )
            torch.stack(list(pages), out=staging)
            self._write_stacked(page_ids, staging)
            return
        for pid, page in zip(page_ids, pages, strict=True):
            # pool slot [L, P, 2, H, D] <- page [L, 2, P, H, D]
            self.kv[:, pid].copy_(page.permute(0, 2, 1, 3, 4))

    def _check_shape(self, page_shape: tuple[int, ...]) -> None:
        if page_shape != self.layout.page_shape:
            raise ValueError(f"a page has shape {page_shape}, expected {self.layout.page_shape}")

    def _write_stacked(self, page_ids: Sequence[int], pages: torch.Tensor) -> None:
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        src = pages.to(device=self.kv.device, dtype=self.kv.dtype, non_blocking=pages.is_pinned())
        self.kv.index_copy_(1, idx, src.permute(1, 0, 3, 2, 4, 5))
