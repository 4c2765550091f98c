"""Cold storage: one namespace's pages sent down to the NAS or the object store on request.

The playground's "send this conversation to cold storage" ends here. The worker hands over
the namespace's pages it took off its device pool (still resident there, until this has
answered); :func:`send_down` adds the namespace's pages in host RAM and, for the object
store, those on the NAS, writes every one of them to the chosen tier, records them in the
ledger, and only then deletes the faster copies (host RAM; for the object store the NAS
too), so the next turn finds them on that tier and nowhere above it.

Order, and why:

1. the write-behind queue is drained first: a page queued for the NAS before this call
   would otherwise land there after it and bring a NAS copy back above the object store.
   The wait is bounded (``DRAIN_WAIT_S``): under steady load the queue may never be empty,
   and a late write costs only where the page is found (the same bytes, on the NAS);
2. data first, then its ledger row (a missing row only leaves an orphan tierd collects);
3. faster copies are deleted last: if a write fails, nothing has been dropped and the
   error reaches the caller (the pages stay where they were, the cache still works).

A concurrent restore of the same pages either reads them before a delete (and gets the
same bytes) or misses and recomputes; it never reads half a page (tiers verify every
block), so the op is safe beside requests using the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.tiers import TierName
from tiering.codec import Block, encoded_size
from tiering.ledger import NAS, OBJECT, Entry
from tiering.store import TieredStore

#: the tiers a namespace may be sent down to
COLD_TIERS: tuple[TierName, ...] = (TierName.NAS, TierName.OBJECT)

#: longest wait for the write-behind queue to empty before the pages are moved
DRAIN_WAIT_S = 5.0


class ColdStorageUnavailable(Exception):
    """The store cannot hold pages on the tier asked for (not configured here)."""


@dataclass(frozen=True)
class Moved:
    """What :func:`send_down` moved."""

    tier: str
    #: pages written to ``tier`` (each page once, wherever it came from)
    pages: int
    #: of those, pages whose copy in host RAM was then dropped
    from_host: int
    #: of those, pages whose NAS copy was then deleted (object store only)
    from_nas: int


def check_tier(store: TieredStore, tier: str) -> TierName:
    """``tier`` as a :class:`TierName` this store can send pages down to, or
    :class:`ColdStorageUnavailable` saying why not."""
    if tier not in COLD_TIERS:
        raise ColdStorageUnavailable(f"tier must be one of {', '.join(COLD_TIERS)}, not {tier!r}")
    name = TierName(tier)
    if name not in store.tiers:
        raise ColdStorageUnavailable(f"this worker has no {name} tier configured")
    if name == TierName.OBJECT and store.ledger is None:
        raise ColdStorageUnavailable("pages in the object store are found through the ledger")
    return name


async def send_down(
    store: TieredStore, namespace: bytes, device: Sequence[Block], tier: str
) -> Moved:
    """Write ``device`` (pages the caller still holds) and the namespace's pages in host RAM
    (and, for the object store, on the NAS) to ``tier``, then drop the faster copies.

    Raises :class:`ColdStorageUnavailable` when ``tier`` is not there, and the tier's own
    error when a write fails (then nothing was dropped).
    """
    name = check_tier(store, tier)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(store.drain(), DRAIN_WAIT_S)
    blocks: dict[bytes, Block] = {b.key: b for b in device if b.namespace == namespace}
    in_host = [b.key for b in store.host.blocks_of(namespace)]
    for key in in_host:
        block = store.host.get_now(key)
        if block is not None:
            blocks.setdefault(key, block)
    on_nas: list[bytes] = []
    if name == TierName.OBJECT:
        on_nas = await _nas_keys(store, namespace)
        missing = [k for k in on_nas if k not in blocks]
        nas = store.tiers.get(TierName.NAS)
        if missing and nas is not None:
            for block in await nas.get_many(missing):
                if block is not None and block.namespace == namespace:
                    blocks[block.key] = block
    pages = list(blocks.values())
    await store.tiers[name].put_many(pages)
    if store.ledger is not None and pages:
        entries = [Entry(b.namespace, b.key, encoded_size(b)) for b in pages]
        await store.ledger.record(entries, NAS if name == TierName.NAS else OBJECT)
    from_nas = 0
    if name == TierName.OBJECT:
        nas_keys = sorted(set(on_nas) | set(blocks))
        nas = store.tiers.get(TierName.NAS)
        if nas is not None:
            await nas.delete_many(nas_keys)
        if store.ledger is not None:
            from_nas = await store.ledger.drop(nas_keys, NAS)
    await store.host.delete_many(in_host)
    return Moved(name, len(pages), len(in_host), from_nas)


async def _nas_keys(store: TieredStore, namespace: bytes) -> list[bytes]:
    """Every key the ledger places on the NAS in ``namespace``."""
    if store.ledger is None or TierName.NAS not in store.tiers:
        return []
    return await store.ledger.keys_in(namespace, NAS)
