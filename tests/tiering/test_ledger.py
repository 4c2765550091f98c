"""The KV ledger on a real Postgres: batching, prefix lookups, drops and coalesced touches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from tests.support.tiering import namespace
from tiering.ledger import NAS, OBJECT, Entry, Ledger


@pytest.fixture
async def counted(pg_dsn: str) -> AsyncIterator[tuple[Ledger, list[str]]]:
    """A ledger whose pool logs every ledger statement sent to Postgres."""
    sent: list[str] = []

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(
            lambda record: sent.append(record.query) if "kv_ledger" in record.query else None
        )

    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2, init=init)
    yield Ledger(pool, touch_batch=1000), sent
    await pool.close()


def _entries(n: int, tenant: str = "t") -> tuple[bytes, list[Entry]]:
    ns = namespace(tenant)
    keys = ns.page_keys(list(range(n * ns.page_size)))
    return ns.digest, [Entry(ns.digest, k, 100 + i) for i, k in enumerate(keys)]


async def test_record_is_one_statement_per_batch_and_prefix_one_round_trip(counted) -> None:
    ledger, sent = counted
    ns, entries = _entries(256)
    sent.clear()
    await ledger.record(entries + entries[:10], NAS)  # duplicates are folded
    assert len(sent) == 1
    await ledger.record(entries[:100], OBJECT)
    sent.clear()
    tiers = await ledger.prefix(ns, [e.key for e in entries])
    assert len(sent) == 1
    assert tiers == [NAS | OBJECT] * 100 + [NAS] * 156


async def test_prefix_stops_at_first_gap_and_respects_namespace(pg_pool) -> None:
    ledger = Ledger(pg_pool)
    ns, entries = _entries(10)
    await ledger.record([e for i, e in enumerate(entries) if i != 6], NAS)
    keys = [e.key for e in entries]
    assert len(await ledger.prefix(ns, keys)) == 6
    other_ns, _ = _entries(1, "someone-else")
    assert await ledger.prefix(other_ns, keys) == []
    assert await ledger.prefix(ns, []) == []


async def test_drop_clears_one_tier_and_deletes_rows_left_empty(pg_pool) -> None:
    ledger = Ledger(pg_pool)
    ns, entries = _entries(4)
    keys = [e.key for e in entries]
    await ledger.record(entries, NAS)
    await ledger.record(entries[:2], OBJECT)
    await ledger.drop(keys, NAS)
    assert await ledger.prefix(ns, keys) == [OBJECT, OBJECT]
    assert await ledger.held(keys, NAS) == set()
    count = await pg_pool.fetchval("SELECT count(*) FROM kv_ledger WHERE key = ANY($1)", keys)
    assert count == 2


async def test_touches_are_coalesced_into_one_statement(counted) -> None:
    ledger, sent = counted
    _ns, entries = _entries(50)
    await ledger.record(entries, NAS)
    before = await ledger.pool.fetchval(
        "SELECT max(last_access) FROM kv_ledger WHERE key = $1", entries[0].key
    )
    for _ in range(3):
        ledger.touch(e.key for e in entries)
    assert ledger.pending_touches == 50
    sent.clear()
    assert await ledger.flush_touches() == 50
    assert len(sent) == 1
    row = await ledger.pool.fetchrow(
        "SELECT hits, last_access FROM kv_ledger WHERE key = $1", entries[0].key
    )
    assert row["hits"] == 3 and row["last_access"] >= before
    assert ledger.pending_touches == 0


async def test_concurrent_overlapping_batches_do_not_deadlock(pg_pool) -> None:
    ledger = Ledger(pg_pool)
    ns, entries = _entries(500)
    batches = [entries[i::3] + entries[::-1][: 200 + i] for i in range(6)]
    await asyncio.gather(
        *(ledger.record(b, NAS if i % 2 else OBJECT) for i, b in enumerate(batches))
    )
    assert len(await ledger.prefix(ns, [e.key for e in entries])) == 500


async def _waits_for(pool: asyncpg.Pool, pid: int, holder: int) -> None:
    """Return once backend ``pid`` is waiting on a lock held by backend ``holder`` (as
    Postgres reports it: the interleaving is observed, never slept on)."""
    async with asyncio.timeout(60):
        while holder not in await pool.fetchval("SELECT pg_blocking_pids($1)", pid):
            pass


async def _drop_behind(
    pg_dsn: str,
    pg_pool: asyncpg.Pool,
    key: bytes,
    tier: int,
    first: Callable[[asyncpg.Connection], Awaitable[None]],
) -> int:
    """Run ``Ledger.drop([key], tier)`` so that it reaches the row while another
    transaction, which ran ``first(conn)`` on it, still holds it, and commit that one then."""
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)  # one backend: its pid
    other = await asyncpg.connect(pg_dsn)
    try:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        async with other.transaction():
            await first(other)
            dropping = asyncio.create_task(Ledger(pool).drop([key], tier))
            await _waits_for(pg_pool, pid, other.get_server_pid())
        return await dropping
    finally:
        await other.close()
        await pool.close()


async def test_drop_keeps_a_bit_recorded_while_it_waited(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    # tierd deleted the page's object and drops OBJECT while a worker's write-behind records
    # the page's new NAS copy: the row must say NAS, not NAS|OBJECT with no object behind it
    ledger = Ledger(pg_pool)
    ns, entries = _entries(1)
    await ledger.record(entries, OBJECT)

    async def record_nas(conn: asyncpg.Connection) -> None:
        await Ledger(conn).record(entries, NAS)  # type: ignore[arg-type]

    changed = await _drop_behind(pg_dsn, pg_pool, entries[0].key, OBJECT, record_nas)
    assert await ledger.prefix(ns, [entries[0].key]) == [NAS]
    assert changed == 1


async def test_drop_deletes_a_row_another_drop_emptied_of_the_rest(
    pg_dsn: str, pg_pool: asyncpg.Pool
) -> None:
    # a worker's repair drops NAS while tierd drops OBJECT: nothing may remain
    ledger = Ledger(pg_pool)
    _ns, entries = _entries(1)
    key = entries[0].key
    await ledger.record(entries, NAS | OBJECT)

    async def drop_nas(conn: asyncpg.Connection) -> None:
        await conn.execute("UPDATE kv_ledger SET tiers = tiers & ~1::smallint WHERE key = $1", key)

    changed = await _drop_behind(pg_dsn, pg_pool, key, OBJECT, drop_nas)
    assert await pg_pool.fetchval("SELECT count(*) FROM kv_ledger WHERE key = $1", key) == 0
    assert changed == 1
    assert await ledger.drop([key], OBJECT) == 0  # nothing left to change
