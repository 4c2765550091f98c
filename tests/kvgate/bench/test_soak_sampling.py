"""What ``kvgate bench soak`` samples: a process' own heap, and the bucket between tierd's
passes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import asyncpg
import psutil

from kvgate.bench.soak_sampling import anonymous_bytes, between_passes
from tiering.tierd import PASS_LOCK

# A quiet process that maps and touches 64 MiB on each line it reads: measured from outside,
# so that no thread of pytest's (nor its heap) moves the figures while they are taken.
TOUCHER = """
import mmap, sys
size, block, held = 64 << 20, b"x" * (1 << 20), []
print("ready", flush=True)
for line in sys.stdin:
    shared = mmap.MAP_SHARED if line.strip() == "shared" else mmap.MAP_PRIVATE
    held.append(mmap.mmap(-1, size, flags=shared | mmap.MAP_ANONYMOUS))
    for offset in range(0, size, len(block)):
        held[-1][offset : offset + len(block)] = block
    print("touched", flush=True)
"""


def test_anonymous_memory_counts_the_heap_and_not_shared_pages() -> None:
    """Touching 64 MiB of shared memory raises RSS by as much and the heap figure not at
    all; touching as much private memory raises both."""
    size = 64 << 20
    child = subprocess.Popen(
        [sys.executable, "-c", TOUCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin and child.stdout

    def touch(kind: str) -> None:
        child.stdin.write(kind + "\n")
        child.stdin.flush()
        assert child.stdout.readline() == "touched\n"

    try:
        assert child.stdout.readline() == "ready\n"
        before, rss = anonymous_bytes(child.pid), psutil.Process(child.pid).memory_info().rss
        touch("shared")
        assert psutil.Process(child.pid).memory_info().rss - rss > size // 2
        assert anonymous_bytes(child.pid) - before < size // 4
        touch("private")
        assert anonymous_bytes(child.pid) - before > size // 2
    finally:
        child.kill()
        child.wait()


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
