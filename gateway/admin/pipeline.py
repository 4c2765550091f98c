"""The leads pipeline in Postgres: search and filter, one lead with its notes, changes.

Every change returns the lead's fields before and after, which the caller writes to the
audit log in the same transaction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date, datetime
from typing import Any

from gateway.admin.signals import PUBLIC_MAIL_DOMAINS, SIGNALS_SQL, TrialUse, score

STATUSES = ("new", "contacted", "qualified", "won", "lost", "nurture")
#: Fields a staff member may change from the lead page (and that the audit log records).
EDITABLE = ("status", "lost_reason", "owner_id", "next_follow_up")


class LeadError(ValueError):
    """A change cannot be applied; the message says what to fix."""


@dataclass(frozen=True)
class Lead:
    """A lead with its owner, trial-use signals and score."""

    id: int
    created_at: datetime
    name: str
    email: str
    company: str
    team_size: str
    monthly_tokens: str
    use_case: str
    message: str
    client_ip: str | None
    status: str
    lost_reason: str
    owner_id: int | None
    owner_email: str | None
    next_follow_up: date | None
    contacted_at: datetime | None
    notified_at: datetime | None
    uncontacted: bool
    trial: TrialUse
    score: int


@dataclass(frozen=True)
class Note:
    """One entry of a lead's notes timeline."""

    created_at: datetime
    author: str
    body: str


@dataclass(frozen=True)
class Filters:
    """What the pipeline page asks for; empty fields do not filter."""

    status: str = ""
    owner_id: int | None = None
    q: str = ""
    uncontacted_only: bool = False


_SELECT = f"""
    SELECT l.id, l.created_at, l.name, l.email, l.company, l.team_size, l.monthly_tokens,
           l.use_case, l.message, host(l.client_ip), l.status, l.lost_reason, l.owner_id,
           o.email, l.next_follow_up, l.contacted_at, l.notified_at,
           (l.status = 'new' AND l.created_at < now() - make_interval(secs => $2)),
           s.trial_requests, s.trial_tokens, s.last_seen, s.limit_hits
    FROM leads l LEFT JOIN users o ON o.id = l.owner_id
    CROSS JOIN LATERAL ({SIGNALS_SQL}) s
"""


def _lead(row: Any) -> Lead:
    trial = TrialUse(row[18], row[19], row[20], row[21])
    return Lead(*row[:18], trial, score(trial, row[5], row[6]))  # type: ignore[arg-type]


async def search(db: Any, filters: Filters, uncontacted_after_s: float) -> list[Lead]:
    """Leads matching ``filters``, newest first (at most 500)."""
    rows = await db.fetch(
        _SELECT
        + """
        WHERE ($3 = '' OR l.status = $3)
          AND ($4::bigint IS NULL OR l.owner_id = $4)
          AND ($5 = '' OR l.name ILIKE $5 OR l.email ILIKE $5 OR l.company ILIKE $5
               OR l.use_case ILIKE $5 OR l.message ILIKE $5)
          AND (NOT $6 OR (l.status = 'new'
                          AND l.created_at < now() - make_interval(secs => $2)))
        ORDER BY l.created_at DESC, l.id DESC LIMIT 500
        """,
        list(PUBLIC_MAIL_DOMAINS),
        float(uncontacted_after_s),
        filters.status,
        filters.owner_id,
        f"%{_escape_like(filters.q)}%" if filters.q else "",
        filters.uncontacted_only,
    )
    return [_lead(r) for r in rows]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def get(db: Any, lead_id: int, uncontacted_after_s: float) -> Lead | None:
    """Lead ``lead_id``, or None."""
    row = await db.fetchrow(
        _SELECT + " WHERE l.id = $3",
        list(PUBLIC_MAIL_DOMAINS),
        float(uncontacted_after_s),
        lead_id,
    )
    return None if row is None else _lead(row)


async def exists(db: Any, lead_id: int) -> bool:
    """Whether lead ``lead_id`` exists."""
    return bool(await db.fetchval("SELECT true FROM leads WHERE id = $1", lead_id))


async def notes(db: Any, lead_id: int) -> list[Note]:
    """The lead's notes, oldest first."""
    rows = await db.fetch(
        "SELECT n.created_at, coalesce(u.email, '(deleted user)'), n.body FROM lead_notes n "
        "LEFT JOIN users u ON u.id = n.author_id WHERE n.lead_id = $1 ORDER BY n.created_at, n.id",
        lead_id,
    )
    return [Note(*r) for r in rows]


async def add_note(db: Any, lead_id: int, author_id: int, body: str) -> None:
    """Append ``body`` to the lead's timeline."""
    if not body.strip():
        raise LeadError("A note needs some text.")
    await db.execute(
        "INSERT INTO lead_notes (lead_id, author_id, body) VALUES ($1, $2, $3)",
        lead_id,
        author_id,
        body.strip(),
    )


def _editable(row: Any) -> dict[str, Any]:
    return {name: row[name] for name in EDITABLE}


async def update(
    conn: Any, lead_id: int, changes: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply ``changes`` (a subset of :data:`EDITABLE`) to the lead; (before, after).

    Raises :class:`LeadError` for an unknown status, a lost lead without a reason, or an
    owner who is not staff. Moving a lead out of "new" stamps when it was first contacted.
    """
    before_row = await conn.fetchrow(
        "SELECT status, lost_reason, owner_id, next_follow_up FROM leads WHERE id = $1 FOR UPDATE",
        lead_id,
    )
    if before_row is None:
        raise LeadError(f"No lead #{lead_id}.")
    before = _editable(before_row)
    after = {**before, **changes}
    if after["status"] not in STATUSES:
        raise LeadError(f"Unknown status {after['status']!r}; pick one of {', '.join(STATUSES)}.")
    if after["status"] == "lost" and not after["lost_reason"]:
        raise LeadError("Say why the lead was lost (the reason field).")
    if after["status"] != "lost":
        after["lost_reason"] = ""
    if after["owner_id"] is not None:
        staff = await conn.fetchval("SELECT is_staff FROM users WHERE id = $1", after["owner_id"])
        if not staff:
            raise LeadError("The owner must be a staff member.")
    await conn.execute(
        """
        UPDATE leads SET status = $2, lost_reason = $3, owner_id = $4, next_follow_up = $5,
            contacted_at = CASE WHEN $2 <> 'new' THEN coalesce(contacted_at, now()) ELSE contacted_at END
        WHERE id = $1
        """,
        lead_id,
        after["status"],
        after["lost_reason"],
        after["owner_id"],
        after["next_follow_up"],
    )
    return before, after


async def staff(db: Any) -> list[tuple[int, str]]:
    """Staff members as (id, email), for the owner choice."""
    rows = await db.fetch("SELECT id, email FROM users WHERE is_staff ORDER BY email")
    return [(r[0], r[1]) for r in rows]


def csv_row(lead: Lead) -> dict[str, Any]:
    """``lead`` flattened for the CSV export."""
    row = asdict(lead)
    trial = row.pop("trial")
    return {**row, **{f"trial_{k}": v for k, v in trial.items()}}
