"""L3: a shared directory (an NFS mount in production) holding one file per block.

How the files are named, written atomically, read and found is
:mod:`tiering.tiers.nas_files`. Here their blocking I/O runs in thread pools so that the
event loop keeps serving; a batch read is split into one run of pages per thread, each
page checksummed in its thread right after its read.

Writes and deletes have threads of their own, so a restore's reads never queue behind a
burst of write-behind. They keep the serving threads' CPU priority: a nicer thread that
is preempted by the engine's OpenMP team while it holds the GIL stalls the engine's next
Python step (measured on 2 cores: at nice 19 the no-reuse waves ran 3-13% slower with
tiering on, at the same priority 1-6%).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.tiers import TierName
from tiering import native
from tiering.codec import Block, CorruptBlock, decode
from tiering.landing import Landed, Landing
from tiering.tiers.base import TierError, TierStats, in_runs
from tiering.tiers.nas_files import (
    NasEntry,
    block_file,
    open_block,
    read_into,
    read_pages,
    scan,
    unlink,
    write_block,
)
from tiering.tiers.slabs import SlabPool

#: A worker thread reads files into one slab until it holds this many bytes (or
#: :data:`GROUP_FILES` files): big enough to be nearly all huge pages, small enough that
#: one long-lived block does not keep much else alive.
GROUP_BYTES = 8 << 20
#: and holds at most this many files open at once
GROUP_FILES = 64
#: pages a read thread lands per call of the page reader: an abandoned landing may still be
#: writing this many pages a thread (held back until the call ends)
LAND_GROUP = 8
#: most read threads by default (a remote NAS's latency wants some in flight)
MAX_READ_THREADS = 8


def default_read_threads() -> int:
    """One read thread per CPU, up to :data:`MAX_READ_THREADS`.

    A page the page cache holds is read at the speed of the kernel's copy, so its threads
    are CPU-bound and more of them than cores only queue for the GIL and the CPUs: on a
    2-core Xeon, landing a 4k-token history (258 pages, 95 MB) from a hot NAS took 16 ms
    on 2 threads, 19-21 on 3 or 4 and 24 on 8 (25 on one).
    """
    return min(MAX_READ_THREADS, os.cpu_count() or 1)


@dataclass(frozen=True)
class NasConfig:
    """Where the NAS is mounted and how to write to it."""

    root: Path
    #: fsync each block before the rename (durable across a power cut, slower)
    fsync: bool = True
    #: read threads (a batch read runs one run of pages on each)
    threads: int = field(default_factory=default_read_threads)
    #: write and delete threads
    write_threads: int = 4
    #: bytes per write call; bounds how long one call holds a thread
    write_chunk: int = 8 << 20
    #: read memory kept for reuse once every block read into it is dropped (see
    #: :class:`~tiering.tiers.slabs.SlabPool`); outside host RAM's budget
    idle_read_bytes: int = 256 << 20


class NasTier:
    """Blocks as files under ``config.root``."""

    name = TierName.NAS

    def __init__(self, config: NasConfig) -> None:
        self.config = config
        self.root = Path(config.root)
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="kv-nas")
        self._writes = ThreadPoolExecutor(config.write_threads, thread_name_prefix="kv-nas-write")
        self._slabs = SlabPool(config.idle_read_bytes)
        # built (or found built) now, on a read thread: not during a first restore's deadline
        self._pool.submit(native.page_reader)
        self._stats = TierStats(self.name)

    def path(self, key: bytes) -> Path:
        """The file that holds ``key``."""
        return Path(self._file(key))

    def _file(self, key: bytes) -> str:
        """:meth:`path` as a string (see :func:`~tiering.tiers.nas_files.block_file`)."""
        return block_file(self.root, key)

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- reads --------------------------------------------------------------------------
    def _read_run(self, keys: Sequence[bytes]) -> list[Block | None]:
        """Read and verify ``keys`` one after another: one worker thread's share of a batch.

        Files are opened in groups of about :data:`GROUP_BYTES` (at most
        :data:`GROUP_FILES` descriptors), each group read into one slab of huge pages,
        reused once every block read into it has been dropped.
        """
        out: list[Block | None] = [None] * len(keys)
        group: list[tuple[int, int, int]] = []  # (position in keys, fd, size), still open
        group_bytes = 0
        try:
            for i, key in enumerate(keys):
                opened = open_block(self._file(key))
                if opened is None:
                    continue
                group.append((i, *opened))
                group_bytes += opened[1]
                if group_bytes >= GROUP_BYTES or len(group) >= GROUP_FILES:
                    todo, group = group, []  # _read_group closes them, even when it fails
                    self._read_group(keys, todo, group_bytes, out)
                    group_bytes = 0
            todo, group = group, []
            if todo:
                self._read_group(keys, todo, group_bytes, out)
        finally:
            for _, fd, _ in group:
                os.close(fd)
        return out

    def _read_group(
        self,
        keys: Sequence[bytes],
        group: list[tuple[int, int, int]],
        nbytes: int,
        out: list[Block | None],
    ) -> None:
        """Read the open files of ``group`` into one slab, verifying each right after its
        read (while it is still in the CPU cache); close every descriptor."""
        buf = self._slabs.take(nbytes)
        pos = closed = 0
        try:
            for i, fd, size in group:
                view = buf[pos : pos + size]
                pos += size
                try:
                    got = read_into(fd, [view], size)
                except OSError as exc:
                    raise TierError(f"nas: cannot read {self._file(keys[i])}: {exc}") from exc
                finally:
                    os.close(fd)
                    closed += 1
                out[i] = self._verify(keys[i], view[:got])
        finally:
            for _, fd, _ in group[closed:]:
                os.close(fd)

    def _verify(self, key: bytes, data: memoryview) -> Block | None:
        """The block in ``data``, or None (deleted and counted) when it fails verification."""
        try:
            # read-only, like the bytes a plain read returns: the host tier keeps this buffer
            return decode(data.toreadonly(), expect_key=key)
        except CorruptBlock:
            self._corrupt(key)
            return None

    def _corrupt(self, key: bytes) -> None:
        self._stats.corruptions += 1
        unlink(self._file(key))

    def _land_run(self, keys: Sequence[bytes], at: Sequence[int], *, into: Landing) -> list[Landed]:
        """Read ``keys`` straight into their pages of ``into`` and verify them there: one
        worker thread's share of :meth:`land`, :data:`LAND_GROUP` pages per read call.
        Stops once ``into`` is closed (the pages not read then are ``REFUSED``)."""
        out = [Landed.REFUSED] * len(keys)
        for start in range(0, len(keys), LAND_GROUP):
            group: list[tuple[int, list[memoryview]]] = []
            for j in range(start, min(start + LAND_GROUP, len(keys))):
                views = into.claim(at[j])
                if views is not None:
                    group.append((j, views))
                elif into.closed:
                    break  # abandoned: the memory is no longer ours to write
                # else another tier holds this page: REFUSED, the file untouched
            if group:
                self._land_group(keys, at, into, group, out)
            if into.closed:
                break
        return out

    def _land_group(
        self,
        keys: Sequence[bytes],
        at: Sequence[int],
        into: Landing,
        group: list[tuple[int, list[memoryview]]],
        out: list[Landed],
    ) -> None:
        """Read and verify the claimed pages of ``group`` (``(position in keys, views)``),
        setting their ``out``; every claim is released, landed or not."""
        check = into.check
        headers = [memoryview(bytearray(check.header_bytes)) for _ in group]
        paths = [self._file(keys[j]) for j, _ in group]
        size = check.header_bytes + check.payload_bytes
        failure: str | None = None
        try:
            read = self._read_pages(
                paths,
                [[h, *views] for h, (_, views) in zip(headers, group, strict=True)],
                check.covered,
            )
        except (OSError, ValueError, TypeError) as exc:  # claims are released below
            failure = f"nas: cannot read {paths[0]} and on: {exc}"
            read = [(-errno.EIO, 0)] * len(group)
        for k, (j, _) in enumerate(group):
            landed = False
            try:
                got, digest = read[k]
                if got == -errno.ENOENT:
                    out[j] = Landed.MISSING
                elif got < 0:
                    failure = failure or f"nas: cannot read {paths[k]}: {os.strerror(-got)}"
                else:
                    out[j] = Landed.MISSING
                    try:
                        if got != size:
                            raise CorruptBlock(f"{paths[k]} is not a block of this layout")
                        check.verify(headers[k], keys[j], digest)
                        out[j], landed = Landed.LANDED, True
                    except CorruptBlock:
                        self._corrupt(keys[j])
            finally:
                # a page that failed verification is free for another tier's copy
                into.release(at[j], landed=landed)
        if failure is not None:
            raise TierError(failure)

    def _read_pages(
        self, paths: Sequence[str], pages: Sequence[Sequence[memoryview]], covered: int
    ) -> list[tuple[int, int]]:
        """:func:`~tiering.tiers.nas_files.read_pages`, through the compiled reader where
        there is one (:mod:`tiering.native`)."""
        return (native.page_reader() or read_pages)(paths, pages, covered)

    async def _spread(
        self,
        run: Callable[..., list[Any]],
        items: Sequence[Any],
        *aligned: Sequence[Any],
        writes: bool = False,
    ) -> list[Any]:
        """``run`` over the read threads (the write threads with ``writes``), one
        contiguous run of ``items`` each (see :func:`~tiering.tiers.base.in_runs`)."""
        if writes:
            return await in_runs(self._writes, self.config.write_threads, run, items, *aligned)
        return await in_runs(self._pool, self.config.threads, run, items, *aligned)

    async def get_many(self, keys: Sequence[bytes]) -> list[Block | None]:
        out: list[Block | None] = await self._spread(self._read_run, keys)
        return [self._stats.count_read(block) for block in out]

    async def land(self, keys: Sequence[bytes], into: Landing, at: Sequence[int]) -> list[Landed]:
        out: list[Landed] = await self._spread(
            functools.partial(self._land_run, into=into), keys, at
        )
        landed = out.count(Landed.LANDED)
        self._stats.hits += landed
        self._stats.misses += out.count(Landed.MISSING)
        self._stats.bytes_read += landed * into.check.payload_bytes
        return out

    async def absent(self, keys: Sequence[bytes]) -> list[bytes]:
        """Those of ``keys`` that have no file now (a read that found none may predate one)."""

        def check() -> list[bytes]:
            return [k for k in keys if not os.path.exists(self._file(k))]

        return await self._run(check)

    async def longest_prefix(self, keys: Sequence[bytes]) -> int:
        def count() -> int:
            n = 0
            for key in keys:
                if not self.path(key).exists():
                    break
                n += 1
            return n

        return await self._run(count)

    # --- writes -------------------------------------------------------------------------
    def _write_run(self, blocks: Sequence[Block]) -> list[Exception | None]:
        """Write ``blocks`` one after another; per block None, or the error it met."""
        out: list[Exception | None] = []
        for block in blocks:
            try:
                self._write_one(block)
            except Exception as exc:  # one failed page must not stop its neighbours
                out.append(exc)
            else:
                out.append(None)
        return out

    def _write_one(self, block: Block) -> None:
        write_block(self.root, block, fsync=self.config.fsync, chunk=self.config.write_chunk)

    async def put_many(self, blocks: Sequence[Block]) -> None:
        # Every write runs to its end (or its clean-up) before this returns, even when one
        # fails: a caller that goes on after the first error must not race writes still
        # in flight (their temporaries would outlive the call).
        results = await self._spread(self._write_run, blocks, writes=True)
        written = [b for b, r in zip(blocks, results, strict=True) if r is None]
        self._stats.puts += len(written)
        self._stats.bytes_written += sum(b.nbytes for b in written)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # --- deletes and scans ----------------------------------------------------------------
    async def delete_many(self, keys: Sequence[bytes]) -> None:
        def delete() -> int:
            return sum(unlink(self.path(k)) for k in keys)

        try:
            self._stats.deletes += await asyncio.get_running_loop().run_in_executor(
                self._writes, delete
            )
        except OSError as exc:
            raise TierError(f"nas: cannot delete under {self.root}: {exc}") from exc

    def remove(self, path: Path) -> None:
        """Delete one file found by :meth:`scan` (an orphan or a stale temporary)."""
        unlink(path)

    def scan(self) -> Iterator[NasEntry]:
        """Every block and temporary file on the NAS (blocking; for tierd and accounting)."""
        return scan(self.root)

    async def usage(self) -> tuple[int, int]:
        """``(files, bytes)`` of complete blocks on the NAS, measured by a scan."""

        def measure() -> tuple[int, int]:
            sizes = [e.size for e in self.scan() if e.key is not None]
            return len(sizes), sum(sizes)

        return await self._run(measure)

    def stats(self) -> TierStats:
        return self._stats.snapshot()

    def close(self) -> None:
        """Stop the I/O threads and unmap the idle read memory."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=False, cancel_futures=True)
        self._slabs.close()
