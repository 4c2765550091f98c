"""Stored responses in Postgres: saving one, reading or deleting it for its owner, and
rebuilding the conversation a ``previous_response_id`` continues.

A response belongs to the rate-limit subject that created it (``team:<id>`` or the free
tier's ``ip:<address>``) and every query filters by it, so another tenant's id reads as
missing, never as forbidden. A chain is walked from the named response back through its
ancestors (at most :data:`MAX_CHAIN`), and its turns replayed oldest first: each turn's
input messages, then its answer as an assistant message. That is exactly the history a
client resending it would send, so the worker's chat template renders the same tokens and
the turn lands on the KV pages the earlier turns left.

Rows expire after :data:`RETENTION` (from their creation, as OpenAI's do); expired rows are
never read, and each insert deletes a batch of them, so the table holds about what the
retention window created without a background job.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import orjson

from gateway.db import HOT_TIMEOUT_S

#: What a response id looks like; anything else is not found without asking Postgres.
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{48}")
#: How long a stored response may be read and continued: a team's, and the free tier's
#: (whose owner is a client address, shared behind NAT and reassigned over time).
RETENTION = {False: timedelta(days=30), True: timedelta(days=1)}
#: Most responses one chain may hold: past it, a client resends the history it needs.
MAX_CHAIN = 100
#: Expired rows deleted by each insert (more than one per insert, so the table shrinks
#: back after a burst).
SWEEP_BATCH = 100

Message = dict[str, str]


class ChainError(Exception):
    """``previous_response_id`` cannot be continued; ``message`` says why and what to do."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def new_id(kind: str) -> str:
    """A fresh id: ``resp_`` (a response) or ``msg_`` (an output message) and 192 random bits."""
    return f"{kind}_{secrets.token_hex(24)}"


@dataclass(frozen=True)
class StoredResponse:
    """One response as stored."""

    id: str
    owner: str
    team_id: int | None
    previous_id: str | None
    #: this turn's input as chat messages (instructions not included: they do not carry
    #: over to the next turn)
    input: list[Message]
    output_text: str
    #: the response object as answered
    body: dict[str, Any]


async def save(pool: asyncpg.Pool, response: StoredResponse, retention: timedelta) -> None:
    """Store ``response`` for ``retention``, deleting a batch of expired rows first."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "DELETE FROM responses WHERE id IN (SELECT id FROM responses"
            " WHERE expires_at < now() LIMIT $1 FOR UPDATE SKIP LOCKED)",
            SWEEP_BATCH,
        )
        await conn.execute(
            "INSERT INTO responses (id, owner, team_id, previous_id, input, output_text,"
            " body, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8)",
            response.id,
            response.owner,
            response.team_id,
            response.previous_id,
            orjson.dumps(response.input).decode(),
            response.output_text,
            orjson.dumps(response.body).decode(),
            retention,
        )


async def body(pool: asyncpg.Pool, owner: str, response_id: str) -> dict[str, Any] | None:
    """The response object stored as ``response_id`` for ``owner``, or None."""
    if not RESPONSE_ID.fullmatch(response_id):
        return None
    raw = await pool.fetchval(
        "SELECT body FROM responses WHERE id = $1 AND owner = $2 AND expires_at > now()",
        response_id,
        owner,
        timeout=HOT_TIMEOUT_S,
    )
    return None if raw is None else orjson.loads(raw)


async def delete(pool: asyncpg.Pool, owner: str, response_id: str) -> bool:
    """Delete ``owner``'s response ``response_id``; False when there was none to delete."""
    if not RESPONSE_ID.fullmatch(response_id):
        return False
    deleted = await pool.fetchval(
        "DELETE FROM responses WHERE id = $1 AND owner = $2 AND expires_at > now() RETURNING true",
        response_id,
        owner,
        timeout=HOT_TIMEOUT_S,
    )
    return bool(deleted)


async def history(pool: asyncpg.Pool, owner: str, response_id: str) -> list[Message]:
    """The conversation up to and including ``owner``'s response ``response_id``, oldest
    turn first; :class:`ChainError` when it is missing, broken or too long."""
    missing = ChainError(
        f"No stored response {response_id!r} (it may have expired, been deleted, or been "
        "created with store=false).",
        404,
    )
    if not RESPONSE_ID.fullmatch(response_id):
        raise missing
    rows = await pool.fetch(
        """
        WITH RECURSIVE chain (id, previous_id, input, output_text, depth) AS (
            SELECT id, previous_id, input, output_text, 1 FROM responses
            WHERE id = $1 AND owner = $2 AND expires_at > now()
          UNION ALL
            SELECT r.id, r.previous_id, r.input, r.output_text, c.depth + 1
            FROM responses r JOIN chain c ON r.id = c.previous_id
            WHERE r.owner = $2 AND r.expires_at > now() AND c.depth <= $3
        )
        SELECT previous_id, input, output_text FROM chain ORDER BY depth DESC
        """,
        response_id,
        owner,
        MAX_CHAIN,
        timeout=HOT_TIMEOUT_S,
    )
    if not rows:
        raise missing
    if len(rows) >= MAX_CHAIN:
        raise ChainError(
            f"The conversation of {response_id!r} already holds {MAX_CHAIN} responses, the "
            "most one chain may; continue it by sending the history you need as 'input'.",
            400,
        )
    if rows[0]["previous_id"] is not None:
        raise ChainError(
            f"The conversation of {response_id!r} reaches back to a response that is no "
            "longer stored (expired or deleted); send the history you need as 'input'.",
            404,
        )
    messages: list[Message] = []
    for row in rows:
        messages += orjson.loads(row["input"])
        messages.append({"role": "assistant", "content": row["output_text"]})
    return messages
