"""The seam between the engine's device KV (L1) and the lower tiers (host, NAS, object store).

The engine calls an :class:`KVOffload` at two points and knows nothing else about tiers:

- when the radix cache evicts pages, it hands them over (token chain + KV) in one batch
  through :meth:`KVOffload.on_evict`;
- when a request is admitted, after the longest device match, it asks
  :meth:`KVOffload.load_prefix` for the KV of the pages that follow, writes them into fresh
  pool pages, inserts them into the radix cache and prefills only the rest.

Namespaces are the requests' cache salts; the implementation folds in the model
fingerprint and the pool's :class:`~workers.engine.kv_pool.KVLayout` itself (it is given
both when built). :class:`NoOffload` is the default: evicted pages are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class EvictedPage:
    """One page leaving the device pool."""

    namespace: str
    #: every token from the start of the sequence up to and including this page's tokens
    token_ids: tuple[int, ...]
    #: this page's KV, ``[layers, 2, page_size, kv_heads, head_dim]`` (a CPU-or-device copy)
    kv: torch.Tensor


@dataclass(frozen=True)
class LoadedPrefix:
    """KV of consecutive pages found below the device, starting at the requested page."""

    #: per page ``[layers, 2, page_size, kv_heads, head_dim]``: one stacked tensor, or one
    #: tensor per page (views of the tiers' buffers, so that no copy is made on the way in)
    kv: torch.Tensor | Sequence[torch.Tensor]
    #: per page, the tier it came from: one of ``host``, ``nas``, ``object``
    tiers: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.kv) != len(self.tiers):
            raise ValueError(f"{len(self.kv)} pages of KV but {len(self.tiers)} tier names")


class KVOffload(Protocol):
    """What the engine needs from the tier ladder."""

    def on_evict(self, pages: list[EvictedPage]) -> None:
        """Take evicted pages. Called on the scheduler thread: queue the work, never block."""
        ...

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, max_pages: int
    ) -> LoadedPrefix | None:
        """KV for up to ``max_pages`` pages of ``token_ids`` starting at page ``start_page``.

        ``token_ids`` is the whole prompt (keys chain from its first page). Return only a
        consecutive run beginning exactly at ``start_page``, or None. Called on the scheduler
        thread at admission: bound the time spent (fetch only when it beats recomputing).
        """
        ...


class NoOffload:
    """No lower tiers: evicted pages are dropped and nothing is ever loaded."""

    def on_evict(self, pages: list[EvictedPage]) -> None:
        return None

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, max_pages: int
    ) -> LoadedPrefix | None:
        return None
