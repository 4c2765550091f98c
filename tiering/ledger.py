"""The KV ledger in Postgres: which shared tier holds which page, and how hot it is.

Every write is one statement per batch (arrays ``unnest``-ed server side; a drop is two, in
one transaction), never one per page. Batches are de-duplicated and sorted by key so that
concurrent writers lock rows in the same order and cannot deadlock. Last-access touches are
coalesced in memory and flushed as one ``UPDATE`` per batch. :meth:`Ledger.prefix` answers
"how much of this chain exists, and where" in one round trip. Host RAM is private to a
worker and never recorded here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from protocol.tiers import LEDGER_BITS, TierName

#: Tier bits in ``kv_ledger.tiers``.
NAS = LEDGER_BITS[TierName.NAS]
OBJECT = LEDGER_BITS[TierName.OBJECT]


@dataclass(frozen=True)
class Entry:
    """One page to record: its namespace digest, key and encoded size in bytes."""

    namespace: bytes
    key: bytes
    size: int


@dataclass(frozen=True)
class Row:
    """One ledger row as tierd sees it."""

    namespace: bytes
    key: bytes
    size: int
    tiers: int
    last_access: datetime


_RECORD = """
INSERT INTO kv_ledger AS l (key, namespace, size, tiers)
SELECT k, ns, sz, $4::smallint FROM unnest($1::bytea[], $2::bytea[], $3::int[]) AS u(k, ns, sz)
ON CONFLICT (key) DO UPDATE SET tiers = l.tiers | EXCLUDED.tiers, size = EXCLUDED.size
"""

# A drop clears the bit, then deletes the rows left with none, in one transaction. The
# UPDATE computes each row's new bits from the row as it is once locked, a concurrent
# record() or drop() that committed first included. (Deciding "delete or clear" in one
# statement judged a row by the statement's snapshot: a row a record() changed meanwhile
# was skipped by both branches and kept a bit whose data was gone.) Between the two
# statements a row may hold 0 (migration 0007); none is ever committed.
_CLEAR = """
UPDATE kv_ledger SET tiers = tiers & ~$2::smallint
WHERE key = ANY($1::bytea[]) AND tiers & $2::smallint <> 0
"""
_DELETE_EMPTY = "DELETE FROM kv_ledger WHERE key = ANY($1::bytea[]) AND tiers = 0"

# The tiers of each leading page of the chain, up to the first page the ledger lacks.
# One primary-key probe per page, as a correlated subquery: written as a join, a custom plan
# made on stale statistics (right after a bulk insert) hashed the namespace's every row
# instead, ~10 ms for 50,000 rows where the probes take 0.7 ms.
_PREFIX = """
WITH c AS (
    SELECT u.ord, (SELECT tiers FROM kv_ledger WHERE key = u.k AND namespace = $1) AS tiers
    FROM unnest($2::bytea[]) WITH ORDINALITY AS u(k, ord)
)
SELECT tiers FROM c
WHERE ord < coalesce((SELECT min(ord) FROM c WHERE tiers IS NULL), 2147483647)
ORDER BY ord
"""

_TOUCH = """
UPDATE kv_ledger l SET last_access = now(), hits = l.hits + u.n
FROM unnest($1::bytea[], $2::int[]) AS u(k, n)
WHERE l.key = u.k
"""

_ROW_COLS = "namespace, key, size, tiers, last_access"


class Ledger:
    """Batched access to ``kv_ledger`` through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, *, touch_batch: int = 4096) -> None:
        self.pool = pool
        self.touch_batch = touch_batch
        self._touches: dict[bytes, int] = {}

    async def record(self, entries: Sequence[Entry], tier: int) -> None:
        """Mark ``entries`` as held by ``tier`` (call only after the data is written)."""
        unique = {e.key: e for e in entries}
        if not unique:
            return
        keys = sorted(unique)
        await self.pool.execute(
            _RECORD,
            keys,
            [unique[k].namespace for k in keys],
            [unique[k].size for k in keys],
            tier,
        )

    async def drop(self, keys: Iterable[bytes], tier: int) -> int:
        """Clear ``tier`` for ``keys``; rows left with no tier disappear. Returns how many
        rows held ``tier`` (0: nothing changed, e.g. another process dropped them first)."""
        ordered = sorted(set(keys))
        if not ordered:
            return 0
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.execute(_CLEAR, ordered, tier)
            await conn.execute(_DELETE_EMPTY, ordered)
        return int(status.split()[-1])  # "UPDATE <rows>"

    async def prefix(self, namespace: bytes, keys: Sequence[bytes]) -> list[int]:
        """Tier bits of each leading page of ``keys`` held somewhere, in one round trip."""
        if not keys:
            return []
        rows = await self.pool.fetch(_PREFIX, namespace, list(keys))
        return [r["tiers"] for r in rows]

    def touch(self, keys: Iterable[bytes]) -> None:
        """Note a hit on ``keys``; written by the next :meth:`flush_touches`."""
        for k in keys:
            self._touches[k] = self._touches.get(k, 0) + 1

    @property
    def pending_touches(self) -> int:
        return len(self._touches)

    async def flush_touches(self) -> int:
        """Write the coalesced touches (one statement per ``touch_batch``); return how many."""
        pending, self._touches = self._touches, {}
        keys = sorted(pending)
        try:
            for i in range(0, len(keys), self.touch_batch):
                chunk = keys[i : i + self.touch_batch]
                await self.pool.execute(_TOUCH, chunk, [pending[k] for k in chunk])
        except BaseException:
            # keep what was not written so that a later flush retries it
            for k in keys[i:]:
                self._touches[k] = self._touches.get(k, 0) + pending[k]
            raise
        return len(keys)

    # --- queries for tierd ---------------------------------------------------------------
    async def usage(self, tier: int) -> int:
        """Bytes the ledger says ``tier`` holds."""
        return int(
            await self.pool.fetchval(
                "SELECT coalesce(sum(size), 0) FROM kv_ledger WHERE tiers & $1::smallint <> 0", tier
            )
        )

    async def coldest(self, tier: int, limit: int, *, offset: int = 0) -> list[Row]:
        """The least recently used rows held by ``tier``."""
        rows = await self.pool.fetch(
            f"SELECT {_ROW_COLS} FROM kv_ledger WHERE tiers & $1::smallint <> 0 "
            "ORDER BY last_access, key LIMIT $2 OFFSET $3",
            tier,
            limit,
            offset,
        )
        return [Row(*r) for r in rows]

    async def idle_since(self, cutoff: datetime, limit: int, tiers: int) -> list[Row]:
        """Rows held by any of ``tiers`` and not accessed since ``cutoff`` (retention)."""
        rows = await self.pool.fetch(
            f"SELECT {_ROW_COLS} FROM kv_ledger WHERE last_access < $1 "
            "AND tiers & $3::smallint <> 0 ORDER BY last_access LIMIT $2",
            cutoff,
            limit,
            tiers,
        )
        return [Row(*r) for r in rows]

    async def over_quota(self, quota_bytes: int) -> list[tuple[bytes, int]]:
        """``(namespace, bytes)`` of every namespace holding more than ``quota_bytes``."""
        rows = await self.pool.fetch(
            "SELECT namespace, sum(size)::bigint AS used FROM kv_ledger "
            "GROUP BY namespace HAVING sum(size) > $1",
            quota_bytes,
        )
        return [(r["namespace"], int(r["used"])) for r in rows]

    async def coldest_in(self, namespace: bytes, limit: int, tiers: int) -> list[Row]:
        """A namespace's least recently used rows held by any of ``tiers``."""
        rows = await self.pool.fetch(
            f"SELECT {_ROW_COLS} FROM kv_ledger WHERE namespace = $1 "
            "AND tiers & $3::smallint <> 0 ORDER BY last_access LIMIT $2",
            namespace,
            limit,
            tiers,
        )
        return [Row(*r) for r in rows]

    async def keys_in(self, namespace: bytes, tier: int) -> list[bytes]:
        """Every key of ``namespace`` that ``tier`` holds (cold storage moves them all)."""
        rows = await self.pool.fetch(
            "SELECT key FROM kv_ledger WHERE namespace = $1 AND tiers & $2::smallint <> 0",
            namespace,
            tier,
        )
        return [r["key"] for r in rows]

    async def held(self, keys: Sequence[bytes], tier: int) -> set[bytes]:
        """Which of ``keys`` the ledger says ``tier`` holds."""
        rows = await self.pool.fetch(
            "SELECT key FROM kv_ledger WHERE key = ANY($1::bytea[]) AND tiers & $2::smallint <> 0",
            list(keys),
            tier,
        )
        return {r["key"] for r in rows}
