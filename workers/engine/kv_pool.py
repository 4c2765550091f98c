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

    def write_pages(self, page_ids: Sequence[int], pages: torch.Tensor) -> None:
        """Store ``pages`` (as :meth:`read_pages` returns them) into ``page_ids``."""
        expected = (len(page_ids), *self.layout.page_shape)
        if tuple(pages.shape) != expected:
            raise ValueError(f"pages have shape {tuple(pages.shape)}, expected {expected}")
        idx = torch.as_tensor(list(page_ids), dtype=torch.long, device=self.kv.device)
        src = pages.to(device=self.kv.device, dtype=self.kv.dtype).permute(1, 0, 3, 2, 4, 5)
        self.kv.index_copy_(1, idx, src)
