"""The one small async interface every tier implements, and its counters.

A tier stores verified :class:`~tiering.codec.Block` objects under their 32-byte keys. Per
key problems never raise: a missing key is ``None``, a corrupt block is ``None`` *and* is
deleted and counted. A backend that is unavailable as a whole (directory read-only, S3
unreachable) raises :class:`TierError`, which the tiered store turns into a counted miss.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from tiering.codec import Block
from tiering.landing import Landed, Landing

#: A tier's answer per key: the block (None if absent), or with a landing what became of it.
Answers = Sequence[Block | None] | Sequence[Landed]


class TierError(RuntimeError):
    """A tier's backend failed as a whole; the message names the tier and the cause."""


@dataclass
class TierStats:
    """Counters of one tier since it was created (a snapshot when returned by ``stats``)."""

    name: str
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    puts: int = 0
    deletes: int = 0
    corruptions: int = 0
    used_bytes: int = 0
    items: int = 0

    def snapshot(self) -> TierStats:
        return dataclasses.replace(self)

    def count_read(self, block: Block | None) -> Block | None:
        """Count one key's read: a hit with its bytes, or a miss (None); returns ``block``."""
        if block is None:
            self.misses += 1
        else:
            self.hits += 1
            self.bytes_read += block.nbytes
        return block


class Tier(Protocol):
    """What the tiered store and tierd need from a tier."""

    name: str

    async def get_many(self, keys: Sequence[bytes]) -> list[Block | None]:
        """The verified blocks for ``keys`` in order; ``None`` where absent or corrupt."""
        ...

    async def land(self, keys: Sequence[bytes], into: Landing, at: Sequence[int]) -> list[Landed]:
        """Put the verified page of each ``keys[j]`` into page ``at[j]`` of ``into``.

        Per page: ``LANDED``; ``MISSING`` when absent or corrupt (deleted and counted);
        ``REFUSED`` when another tier holds the page or ``into`` was closed (the tier's copy
        was not looked at, so nothing is known about it)."""
        ...

    async def put_many(self, blocks: Sequence[Block]) -> None:
        """Store ``blocks`` (overwriting same keys); raise :class:`TierError` if impossible."""
        ...

    async def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are present, without reading or verifying them."""
        ...

    async def delete_many(self, keys: Sequence[bytes]) -> None:
        """Remove ``keys``; absent keys are fine."""
        ...

    def stats(self) -> TierStats:
        """A snapshot of the counters."""
        ...


async def in_runs(
    executor: Executor,
    threads: int,
    run: Callable[..., list[Any]],
    items: Sequence[Any],
    *aligned: Sequence[Any],
) -> list[Any]:
    """``run`` over one contiguous run of ``items`` (and of each ``aligned`` sequence) per
    thread of ``executor``, ``threads`` runs at most: as many pages in flight as threads,
    without a future and a loop wake-up per page. The runs' answers, concatenated."""
    runs = max(1, min(threads, len(items)))
    bounds = [len(items) * r // runs for r in range(runs + 1)]
    loop = asyncio.get_running_loop()
    parts = await asyncio.gather(
        *(
            loop.run_in_executor(executor, run, items[a:b], *(seq[a:b] for seq in aligned))
            for a, b in itertools.pairwise(bounds)
        )
    )
    return [answer for part in parts for answer in part]
