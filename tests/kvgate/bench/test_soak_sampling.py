"""What ``kvgate bench soak`` samples: a process' own heap, and the bucket between tierd's
passes."""

from __future__ import annotations

import asyncio
import mmap
import os
import threading

import asyncpg
import psutil

from kvgate.bench.soak_sampling import anonymous_bytes, between_passes
from tiering.tierd import PASS_LOCK


def test_anonymous_memory_counts_the_heap_and_not_shared_pages() -> None:
    """Touching 64 MiB of shared memory raises RSS by as much and the heap figure not at
    all; touching as much private memory raises both."""
    pid = os.getpid()
    size = 64 << 20
    before = anonymous_bytes(pid)
    shared = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    rss = psutil.Process(pid).memory_info().rss
    shared.write(b"x" * size)
    assert psutil.Process(pid).memory_info().rss - rss > size // 2
    assert anonymous_bytes(pid) - before < size // 4
    private = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    private.write(b"x" * size)
    assert anonymous_bytes(pid) - before > size // 2
    shared.close()
    private.close()


async def test_the_bucket_is_listed_only_between_tierd_passes(pg_dsn: str) -> None:
    """While a tierd holds its pass lock, the listing waits; it runs once the pass ends,
    and leaves the lock free for the next pass."""
    tierd = await asyncpg.connect(pg_dsn)
    try:
        assert await tierd.fetchval("SELECT pg_try_advisory_lock($1)", PASS_LOCK)
        listed = threading.Event()

        def listing() -> int:
            listed.set()
            return 7

        result = asyncio.create_task(asyncio.to_thread(between_passes, pg_dsn, listing))
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        while not await tierd.fetchval(waiting):  # until the listing queues for the lock
            assert not result.done(), result
            await asyncio.sleep(0.01)
        assert not listed.is_set()
        await tierd.execute("SELECT pg_advisory_unlock($1)", PASS_LOCK)
        assert await result == 7 and listed.is_set()
        assert await tierd.fetchval("SELECT pg_try_advisory_lock($1)", PASS_LOCK)
        await tierd.execute("SELECT pg_advisory_unlock($1)", PASS_LOCK)
    finally:
        await tierd.close()
