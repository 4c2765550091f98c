"""Cold storage at the engine: one namespace's device pages sent down to the NAS or S3.

The playground's "send this conversation to cold storage" asks a worker to take a cache
namespace (the visitor's cache salt) off its device pool. Three steps, so that a page is
on the chosen tier before it leaves a faster one and the scheduler never waits on a disk:

1. under the engine's step lock (no step runs, so no page is being written or restored),
   list the namespace's pages no running request pins and copy their KV out;
2. without the lock, the offload writes those copies and the namespace's host RAM pages
   to the tier, then drops the host copies (:mod:`tiering.cold_storage`);
3. under the lock again, free the listed pages that are still unpinned and childless;
   any a request pinned or extended meanwhile stay on the device (its next turn simply
   finds them there), and pinned pages are never touched.

A failure in step 2 raises before step 3: the device still holds every page.
"""

from __future__ import annotations

import threading

from workers.engine.api import SentDown
from workers.engine.offload import KVOffload, OffloadPage
from workers.engine.radix import RadixCache


def send_down(
    cache: RadixCache, offload: KVOffload, lock: threading.Lock, namespace: str, tier: str
) -> SentDown:
    """Move ``namespace``'s unpinned device pages (and its host RAM pages) to ``tier``."""
    with lock:
        nodes, chains, pinned = cache.unpinned(namespace)
        kv = cache.pool.page_copies([n.page for n in nodes])  # type: ignore[misc]
    pages = [OffloadPage(namespace, chain, kv[i]) for i, chain in enumerate(chains)]
    moved = offload.send_down(namespace, pages, tier)
    with lock:
        freed = cache.drop(nodes)
    return SentDown(
        tier=moved.tier,
        pages=moved.pages,
        device_pages=freed,
        pinned_pages=pinned + len(nodes) - freed,
        host_pages=moved.from_host,
        nas_pages=moved.from_nas,
    )
