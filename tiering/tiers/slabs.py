"""Read buffers for the NAS tier: huge-page memory, handed out and taken back when unused.

A restore is bound by fresh memory more than by the page cache: every 4 KiB page a read
lands in costs a page fault and a zero-fill. A slab is mapped in 2 MiB (transparent huge)
pages, which take 512 times fewer faults, and a :class:`SlabPool` gives a slab whose
blocks have all been dropped to the next read instead of unmapping it, so a steady
restore rate reuses warm memory and pays no faults at all.

A slab goes back to its pool only when the last view of it dies: blocks, tensors made with
``torch.frombuffer`` and memoryview slices all hold a reference to the buffer they view, so
memory that is still readable anywhere is never handed out again.
"""

from __future__ import annotations

import contextlib
import mmap
import threading

import numpy as np

_HUGE_PAGE = 2 << 20


def _map(size: int) -> mmap.mmap:
    """``size`` bytes (whole 2 MiB pages) of anonymous memory, asking for huge pages."""
    mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            mem.madvise(mmap.MADV_HUGEPAGE)
    return mem


class _Lease(np.ndarray):
    """A pooled slab's exporter: when its last view dies, its memory goes back to the pool."""

    def __del__(self) -> None:
        pool, mem = self.__dict__.get("_pool"), self.__dict__.get("_mem")
        if pool is not None and mem is not None:
            pool._give_back(mem)


class SlabPool:
    """Slabs in whole 2 MiB pages, kept for reuse up to ``max_idle_bytes`` while unused.

    Reused slabs are whole huge pages (a tail of small pages would not be reusable for a
    larger read), so a pooled slab may be up to 2 MiB larger than asked for. Threads may
    take and drop slabs concurrently.
    """

    def __init__(self, max_idle_bytes: int = 256 << 20) -> None:
        self.max_idle_bytes = max_idle_bytes
        # RLock: a slab's last view can die inside the lock (a garbage collection running
        # while this thread holds it), and giving it back then takes the lock again.
        self._lock = threading.RLock()
        self._idle: dict[int, list[mmap.mmap]] = {}
        self._idle_bytes = 0
        self._closed = False

    @property
    def idle_bytes(self) -> int:
        """Memory held for reuse now (not viewed by anything)."""
        return self._idle_bytes

    def take(self, nbytes: int) -> memoryview:
        """A writable buffer of exactly ``nbytes``; its memory returns here when unused."""
        size = max(1, -(-nbytes // _HUGE_PAGE)) * _HUGE_PAGE
        mem = None
        with self._lock:
            free = self._idle.get(size)
            if free:
                mem = free.pop()
                self._idle_bytes -= size
        if mem is None:
            mem = _map(size)
        lease = np.frombuffer(mem, dtype=np.uint8).view(_Lease)
        lease._pool, lease._mem = self, mem
        return memoryview(lease)[:nbytes]

    def _give_back(self, mem: mmap.mmap) -> None:
        with self._lock:
            if self._closed or self._idle_bytes + len(mem) > self.max_idle_bytes:
                return  # unmapped when the last reference to it goes
            self._idle.setdefault(len(mem), []).append(mem)
            self._idle_bytes += len(mem)

    def close(self) -> None:
        """Unmap the idle slabs; slabs still in use are unmapped when they are dropped."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            self._idle_bytes = 0
