"""A landing: the memory a fetch reads verified pages straight into.

A restore that ends in the engine's pool would otherwise read each page into a tier's
buffer and copy it from there into the pool; on a CPU pool that copy costs as much memory
traffic as the read itself. A :class:`Landing` names, for every page of one fetch, the
writable memory the page must end in — one or more byte views whose concatenation is the
page's payload — and the namespace, dtype and shape the page must have. Tiers read (or
copy) into those views and verify the checksum there. A page that fails verification is
reported as not landed: its memory then holds bytes the caller recomputes over.

Each page is written by one tier: whichever claims it first writes it, any other is refused
while that claim stands. A write whose page fails verification gives the claim back (the
page is written whole again by whoever claims it next, never mixed). A tier's answer per
page is a :class:`Landed`, which keeps "this tier has no good copy" (``MISSING``: the
ledger may be corrected) apart from "this tier was not let write" (``REFUSED``: another
tier holds the page, or the fetch was given up — nothing is known about this tier's copy,
and nothing may be dropped for it).

The fence. A tier's threads may still be reading when the fetch is abandoned at its
deadline, and the memory belongs to the caller again from then on. Every write happens
between :meth:`Landing.claim` and :meth:`Landing.release`; once :meth:`Landing.close`
returns, no claim succeeds, and close says which pages are still being written. The
caller keeps their memory out of use until the callback it gave close for each of them
runs (on the writing thread, when that write ends).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence

import numpy as np

from tiering.codec import Block, PageCheck


class Landed(enum.Enum):
    """What became of one page a tier was asked to land; true only for ``LANDED``."""

    #: read (or copied) into its page and verified there
    LANDED = "landed"
    #: the tier holds no good copy: absent, corrupt (then deleted), or not this page
    MISSING = "missing"
    #: not written: another tier claimed the page first, or the landing is closed. Says
    #: nothing about the tier's copy, so it is never a reason to drop a ledger bit.
    REFUSED = "refused"

    def __bool__(self) -> bool:
        return self is Landed.LANDED


class Landing:
    """Where each page of one fetch must land, and the fence around writing there."""

    def __init__(
        self,
        namespace: bytes,
        dtype: str,
        shape: tuple[int, ...],
        views: Sequence[Sequence[memoryview]],
    ) -> None:
        """``views[i]`` is page ``i``'s memory, in payload order.

        ``views`` may make each page's views when indexed (a restore of thousands of pages
        into a layer-major pool would otherwise build tens of thousands of views up front);
        a page's views are checked when it is claimed.
        """
        #: what every page must be (and the fast check that it is)
        self.check = PageCheck(namespace, dtype, shape)
        self._views = views
        self._lock = threading.Condition(threading.Lock())
        self._open = True
        self._claimed: set[int] = set()
        self._writing: set[int] = set()
        self._when_done: dict[int, Callable[[], None]] = {}  # late pages' callbacks

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (the fetch was given up)."""
        return not self._open

    def claim(self, i: int) -> list[memoryview] | None:
        """Page ``i``'s views to write; None once the landing is closed, or while page ``i``
        is claimed by another writer (landed, or being written: two writers could leave a
        mix of their bytes)."""
        parts = [v if v.format == "B" and v.ndim == 1 else v.cast("B") for v in self._views[i]]
        size = sum(v.nbytes for v in parts)
        if size != self.check.payload_bytes:
            raise ValueError(
                f"page {i} lands in {size} bytes, a page has {self.check.payload_bytes}"
            )
        with self._lock:
            if not self._open or i in self._claimed:
                return None
            self._claimed.add(i)
            self._writing.add(i)
        return parts

    def release(self, i: int, *, landed: bool = True) -> None:
        """The write of page ``i`` (claimed before) is over.

        ``landed=False`` (the bytes failed verification) gives the claim back, so that
        another tier's good copy may still land there: its write starts only now that this
        one has ended, and covers the whole page.
        """
        with self._lock:
            self._writing.discard(i)
            if not landed:
                self._claimed.discard(i)
            done = self._when_done.pop(i, None)
            if not self._open:
                self._lock.notify_all()  # close() may be waiting
        if done is not None:
            done()

    def fill(self, i: int, block: Block) -> Landed:
        """Copy a verified in-memory block into page ``i``: ``MISSING`` (nothing written)
        when the block is not of the landing's namespace, dtype and shape, ``REFUSED`` once
        closed or while another writer holds page ``i``.

        The copy runs without the GIL (numpy's), so fills on several threads copy at once.
        """
        c = self.check
        if (block.namespace, block.dtype, block.shape) != (c.namespace, c.dtype, c.shape):
            return Landed.MISSING
        parts = self.claim(i)
        if parts is None:
            return Landed.REFUSED
        try:
            src = np.frombuffer(block.payload, np.uint8)
            pos = 0
            for part in parts:
                np.copyto(np.frombuffer(part, np.uint8), src[pos : pos + part.nbytes])
                pos += part.nbytes
        finally:
            self.release(i)
        return Landed.LANDED

    def close(
        self, grace_s: float = 0.0, hold: Callable[[int], Callable[[], None]] | None = None
    ) -> set[int]:
        """Refuse further claims; wait up to ``grace_s`` for writes under way; return the
        pages still being written after that.

        For each such page ``i``, ``hold(i)`` runs now (keep the memory out of use) and the
        callable it returns runs when that write ends (the memory may be used again).
        """
        with self._lock:
            self._open = False
            self._lock.wait_for(lambda: not self._writing, timeout=grace_s)
            if hold is not None:
                self._when_done = {i: hold(i) for i in self._writing}
            return set(self._writing)
