"""Usage metering: one row per request, buffered in memory, written in batches.

Rows collect in memory and a flusher writes them in one statement per batch that also
maintains the daily roll-up and settles the daily token quota to the actual tokens (on
the day of admission, which reserved the request's most). Each row carries a unique
request id and is inserted with ``ON CONFLICT DO NOTHING``; the roll-up and the
settlement are computed from the rows actually inserted, so a batch retried after a lost
reply is counted once. While Postgres is unavailable rows wait (up to ``buffer_max``) and
are retried.

A successful answer's row is *committed* before the answer's end reaches the client
(:meth:`UsageRecorder.commit`): a replica killed right after a client saw ``[DONE]``
would otherwise take the rows of its last ``flush_s`` with it (measured by ``kvgate bench
faults``). Rows waiting to be committed wake the flusher at once, and every row queued
meanwhile goes in the same batch (a group commit), so Postgres still sees one statement
per batch. While Postgres is failing nobody waits: the row stays queued for the retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from datetime import datetime
from typing import NamedTuple

import asyncpg

from gateway.db import UNAVAILABLE
from protocol.tiers import TIERS

log = logging.getLogger(__name__)

_BATCH_MAX = 5000
#: the longest an answer's end waits for its usage row to be committed
COMMIT_WAIT_S = 2.0


class UsageRow(NamedTuple):
    """What one request cost and how it went (a tuple: batches go to asyncpg as columns)."""

    request_id: str
    ts: datetime
    team_id: int | None
    key_id: int | None
    client_ip: str | None
    subject: str
    model: str
    worker: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reserved_tokens: int
    ttft_ms: float | None
    latency_ms: float
    status: int
    #: cached prompt tokens by the tier they came back from (:data:`TIER_COLUMNS`)
    cached_device_tokens: int = 0
    cached_host_tokens: int = 0
    cached_nas_tokens: int = 0
    cached_object_tokens: int = 0


#: tier -> the column of ``usage`` and ``usage_daily`` counting cached tokens from it
#: (migrations/0011_usage_tiers.sql); ``UsageRow`` has a field of each name
TIER_COLUMNS: dict[str, str] = {tier: f"cached_{tier}_tokens" for tier in TIERS}


def tier_counts(by_tier: dict[str, int]) -> dict[str, int]:
    """A worker's ``cached_tokens_by_tier`` as :class:`UsageRow` fields (unknown tiers left
    out)."""
    return {TIER_COLUMNS[t]: n for t, n in by_tier.items() if t in TIER_COLUMNS}


_TIERS = ", ".join(TIER_COLUMNS.values())
_COLUMNS = list(UsageRow._fields)
_TYPES = [
    "text", "timestamptz", "bigint", "bigint", "inet", "text", "text", "text",
    "integer", "integer", "integer", "integer", "real", "real", "smallint",
    "integer", "integer", "integer", "integer",
]  # fmt: skip
_UNNEST = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(_TYPES))
_INSERT = f"""
WITH ins AS (
    INSERT INTO usage ({", ".join(_COLUMNS)})
    SELECT * FROM unnest({_UNNEST})
    ON CONFLICT (request_id) DO NOTHING
    RETURNING *
), daily AS (
    INSERT INTO usage_daily (day, team_id, model, requests, prompt_tokens, cached_tokens,
                             completion_tokens, {_TIERS})
    SELECT (ts AT TIME ZONE 'UTC')::date, team_id, model, count(*), sum(prompt_tokens),
           sum(cached_tokens), sum(completion_tokens),
           {", ".join(f"sum({c})" for c in TIER_COLUMNS.values())}
    FROM ins GROUP BY 1, 2, 3
    ON CONFLICT (day, (coalesce(team_id, 0)), model) DO UPDATE SET
        requests = usage_daily.requests + excluded.requests,
        prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = usage_daily.cached_tokens + excluded.cached_tokens,
        completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens,
        {", ".join(f"{c} = usage_daily.{c} + excluded.{c}" for c in TIER_COLUMNS.values())}
), settle AS (
    -- Against the day the request was admitted on (the row's time is its end), including
    -- requests admitted locally while Postgres was down: they reserved nothing here
    -- (reserved_tokens 0), so their whole use is added now.
    SELECT subject, ((ts - latency_ms * interval '1 millisecond') AT TIME ZONE 'UTC')::date AS day,
           sum(prompt_tokens + completion_tokens - reserved_tokens) AS delta
    FROM ins GROUP BY 1, 2
)
INSERT INTO rate_daily AS d (subject, day, used)
SELECT subject, day, greatest(0, delta) FROM settle WHERE delta <> 0
ON CONFLICT (subject, day) DO UPDATE SET used = greatest(
    0, d.used + (SELECT s.delta FROM settle s WHERE s.subject = d.subject AND s.day = d.day)
)
"""


class UsageRecorder:
    """Buffers usage rows and writes them in batches."""

    def __init__(self, pool: asyncpg.Pool, flush_s: float, buffer_max: int) -> None:
        self._pool = pool
        self._flush_s = flush_s
        self._buffer: deque[UsageRow] = deque()
        self._max = buffer_max
        self.dropped = 0
        self.written = 0
        #: request id -> whoever waits for that row to be committed
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._wake = asyncio.Event()
        #: the last flush failed (Postgres away): commits do not wait meanwhile
        self._failing = False

    def record(self, row: UsageRow) -> None:
        """Queue ``row`` (never blocks; the oldest row is dropped when the buffer is full)."""
        if len(self._buffer) >= self._max:
            self._buffer.popleft()
            self.dropped += 1
        self._buffer.append(row)

    async def commit(self, row: UsageRow, wait_s: float = COMMIT_WAIT_S) -> bool:
        """Queue ``row`` and wait until a batch holding it is written (at most ``wait_s``,
        not at all while Postgres is failing); whether it was. Unwritten, the row stays
        queued like any other."""
        self.record(row)
        if self._failing:
            return False
        written = asyncio.get_running_loop().create_future()
        self._waiting[row.request_id] = written
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(written), wait_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiting.pop(row.request_id, None)

    @property
    def pending(self) -> int:
        """Rows not yet written."""
        return len(self._buffer)

    async def flush(self) -> None:
        """Write everything buffered now; on failure the rows stay queued and it raises."""
        while self._buffer:
            # Take the batch out first: record() may drop from the buffer meanwhile.
            batch = [self._buffer.popleft() for _ in range(min(len(self._buffer), _BATCH_MAX))]
            columns = list(zip(*batch, strict=True))
            try:
                await self._pool.execute(_INSERT, *columns, timeout=30)
            except BaseException:
                self._failing = True
                self._buffer.extendleft(reversed(batch))
                while len(self._buffer) > self._max:
                    self._buffer.popleft()
                    self.dropped += 1
                raise
            self._failing = False
            self.written += len(batch)
            for row in batch:
                waiter = self._waiting.get(row.request_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    async def run(self) -> None:
        """Flush every ``flush_s`` seconds, and at once when a row waits to be committed;
        after a failure, not before ``flush_s`` has passed."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_s)
            self._wake.clear()
            try:
                await self.flush()
            except UNAVAILABLE as exc:
                log.warning("usage rows kept for retry (%d pending): %s", self.pending, exc)
            except Exception:
                # Not an outage, but the rows are still kept: retrying beats losing them.
                log.exception("usage flush failed (%d pending); retrying", self.pending)
            else:
                continue
            await asyncio.sleep(self._flush_s)  # a failing Postgres is not hammered

    async def close(self, deadline_s: float) -> None:
        """Flush what is left, retrying until ``deadline_s`` seconds have passed."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while True:
            try:
                await self.flush()
                return
            except UNAVAILABLE as exc:
                if loop.time() >= end:
                    log.error("%d usage rows lost at shutdown: %s", self.pending, exc)
                    return
                await asyncio.sleep(min(self._flush_s, max(0.0, end - loop.time())))
