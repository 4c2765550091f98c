"""Contact-sales submissions: validation, and storing a lead under the per-IP limit.

The limit is counted from the leads table itself inside one transaction that holds an
advisory lock on the client address, so it holds across gateway replicas and concurrent
posts, and needs no separate counter to expire.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import asyncpg
from starlette.datastructures import FormData

from gateway.pages.kit import text_field
from gateway.pages.users import is_valid_email

TEAM_SIZES = ("1-10", "11-50", "51-200", "201-1000", "1000+")
MONTHLY_TOKENS = ("< 10M", "10M-100M", "100M-1B", "1B-10B", "> 10B")
#: The hidden field a person never fills; a bot filling every input does.
HONEYPOT = "website"

_MAX_LEN = {"name": 200, "email": 254, "company": 200, "use_case": 2000, "message": 5000}


class ContactLimited(Exception):
    """This address already sent as many contact forms as the window allows."""


@dataclass(frozen=True)
class LeadForm:
    """A contact-sales submission as typed in (trimmed, email lower-cased)."""

    name: str
    email: str
    company: str
    team_size: str
    monthly_tokens: str
    use_case: str
    message: str

    @classmethod
    def parse(cls, form: FormData) -> tuple[LeadForm, dict[str, str]]:
        """The submission and a field -> problem map (empty when it can be stored)."""
        values = {f.name: text_field(form, f.name) for f in fields(cls)}
        values["email"] = values["email"].lower()
        lead = cls(**values)
        errors: dict[str, str] = {}
        for name in ("name", "company"):
            if not values[name]:
                errors[name] = "Please fill this in."
        if not is_valid_email(lead.email):
            errors["email"] = "Enter a work email address like you@company.com."
        if lead.team_size not in TEAM_SIZES:
            errors["team_size"] = "Pick a team size."
        if lead.monthly_tokens not in MONTHLY_TOKENS:
            errors["monthly_tokens"] = "Pick the expected monthly tokens."
        for name, most in _MAX_LEN.items():
            if len(values[name]) > most:
                errors[name] = f"At most {most} characters, please."
        return lead, errors

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (for templates that re-show the form)."""
        return asdict(self)


async def store(
    pool: asyncpg.Pool, lead: LeadForm, client_ip: str, limit: int, window_s: float
) -> int:
    """Insert ``lead`` from ``client_ip``; its id. Raises :class:`ContactLimited` when
    ``client_ip`` already stored ``limit`` leads in the last ``window_s`` seconds."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", client_ip)
        recent = await conn.fetchval(
            "SELECT count(*) FROM leads WHERE client_ip = $1::inet "
            "AND created_at > clock_timestamp() - make_interval(secs => $2)",
            client_ip,
            float(window_s),
        )
        if recent >= limit:
            raise ContactLimited
        return await conn.fetchval(
            """
            INSERT INTO leads (name, email, company, team_size, monthly_tokens, use_case,
                               message, client_ip)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8::inet) RETURNING id
            """,
            lead.name,
            lead.email,
            lead.company,
            lead.team_size,
            lead.monthly_tokens,
            lead.use_case,
            lead.message,
            client_ip,
        )


async def mark_notified(db: Any, lead_id: int) -> None:
    """Record that the sales team was told about ``lead_id``."""
    await db.execute("UPDATE leads SET notified_at = now() WHERE id = $1", lead_id)
