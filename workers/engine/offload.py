"""The seam between the engine's device KV (L1) and the lower tiers (host, NAS, object store).

The engine calls an :class:`KVOffload` at these points and knows nothing else about tiers:

- it hands full pages over (token chain + KV) in one batch through
  :meth:`KVOffload.offer`: as soon as the radix cache takes them when the offload
  asks for write-through (:attr:`KVOffload.write_through`), so that another worker
  sharing the lower tiers can resume the conversation while this one still holds it;
  otherwise when the radix cache evicts them. A page is handed over once: pages the
  tiers gave back, or already handed over, leave the device without a second copy;
- when a request is admitted, it reports the pages it found in L1
  (:meth:`KVOffload.touch`): under write-through the tiers hold them too, and their
  least-recently-used choices must see a conversation served from L1 as alive;
- when a request must queue (others ahead, or no room yet), it names the pages L1 lacks
  (:meth:`KVOffload.fetch_early`), so that reading them overlaps the wait;
- after that device match, it hands
  :meth:`KVOffload.load_prefix` the fresh pool pages that follow (as a
  :class:`~workers.engine.kv_pool.RestoreTarget`); whatever consecutive run of them is
  restored goes into the radix cache, and only the rest is prefilled;
- on request (the playground's cold storage) it hands one namespace's pages to
  :meth:`KVOffload.send_down`, which writes them to the NAS or the object store and drops
  the namespace's host RAM copies; the engine frees the device pages once that returned.

Namespaces are the requests' cache salts; the implementation folds in the model
fingerprint and the pool's :class:`~workers.engine.kv_pool.KVLayout` itself (it is given
both when built). :class:`NoOffload` is the default: evicted pages are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from tiering.cold_storage import ColdStorageUnavailable, Moved
from workers.engine.kv_pool import RestoreTarget


@dataclass(frozen=True)
class OffloadPage:
    """One full page handed to the lower tiers."""

    namespace: str
    #: every token from the start of the sequence up to and including this page's tokens
    token_ids: tuple[int, ...]
    #: this page's KV, ``[layers, page_size, 2, kv_heads, head_dim]``: a copy the offload may
    #: keep (on a CPU, memory of its own; on a device, possibly a view of a gathered batch)
    kv: torch.Tensor


@dataclass(frozen=True)
class Restored:
    """What a restore put into the target's pages."""

    #: per restored page, from the first on, the tier it came from (``host``, ``nas``,
    #: ``object``); those pages are in the pool
    tiers: tuple[str, ...] = ()
    #: positions of pages (after the restored ones) that an abandoned read may still be
    #: writing: the pool holds them back, and the request must take fresh pages instead
    late: frozenset[int] = frozenset()


class KVOffload(Protocol):
    """What the engine needs from the tier ladder."""

    #: take pages when the radix cache does (True), or only when it evicts them
    write_through: bool

    def offer(self, pages: list[OffloadPage]) -> None:
        """Take pages for the lower tiers. Called on the scheduler thread: queue the work,
        never block."""
        ...

    def touch(self, namespace: str, token_ids: Sequence[int], n_pages: int) -> None:
        """Note that the first ``n_pages`` pages of ``token_ids`` were used from L1, when
        the lower tiers were not asked for more (:meth:`load_prefix` notes them itself).
        Called on the scheduler thread: never block."""
        ...

    def fetch_early(
        self, namespace: str, token_ids: Sequence[int], start_page: int, end_page: int
    ) -> None:
        """Start reading pages ``start_page`` to ``end_page`` of ``token_ids`` for a request
        that must queue; its :meth:`load_prefix` from ``start_page`` then takes them.
        Called on the scheduler thread: never block."""
        ...

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, target: RestoreTarget
    ) -> Restored:
        """Restore pages of ``token_ids`` from page ``start_page`` on into ``target``.

        ``token_ids`` is the whole prompt (keys chain from its first page); ``target`` has
        one pool page per page wanted. Only a consecutive run from its first page counts;
        call ``target.commit(n)`` for it. The first ``start_page`` pages were found in L1:
        note their use as :meth:`touch` would. Called on the scheduler thread at admission:
        bound the time spent (fetch only when it beats recomputing).
        """
        ...

    def send_down(self, namespace: str, pages: list[OffloadPage], tier: str) -> Moved:
        """Write ``pages`` (the namespace's device pages, still held by the caller) and the
        namespace's pages in host RAM to ``tier`` (``nas`` or ``object``), then drop the
        faster copies below the device. Blocks until done (call it off the scheduler
        thread); :class:`~tiering.cold_storage.ColdStorageUnavailable` when ``tier`` is
        not configured, the tier's error when a write failed (nothing dropped then)."""
        ...


class NoOffload:
    """No lower tiers: evicted pages are dropped and nothing is ever loaded."""

    write_through = False

    def offer(self, pages: list[OffloadPage]) -> None:
        return None

    def touch(self, namespace: str, token_ids: Sequence[int], n_pages: int) -> None:
        return None

    def fetch_early(
        self, namespace: str, token_ids: Sequence[int], start_page: int, end_page: int
    ) -> None:
        return None

    def load_prefix(
        self, namespace: str, token_ids: Sequence[int], start_page: int, target: RestoreTarget
    ) -> Restored:
        return Restored()

    def send_down(self, namespace: str, pages: list[OffloadPage], tier: str) -> Moved:
        raise ColdStorageUnavailable("this worker keeps no tiers below its device pool")
