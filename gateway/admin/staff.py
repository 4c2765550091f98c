"""Creating dashboard users from the command line (``kvgate admin users create``).

Staff cannot sign up through the site: the flag is only ever set here, by someone with
access to the database.
"""

from __future__ import annotations

from typing import Any

from gateway.pages import passwords
from gateway.pages.users import normalize_email


class StaffError(ValueError):
    """The user cannot be created; the message says what to change."""


async def create_user(db: Any, email: str, password: str, *, staff: bool) -> tuple[int, bool]:
    """A verified user ``email`` (staff when ``staff``): (id, created). An existing user is
    left as is, except that ``staff`` promotes them (their password is not changed)."""
    email = normalize_email(email)
    if "@" not in email:
        raise StaffError(f"{email!r} is not an email address.")
    try:
        passwords.check_strength(password)
    except passwords.WeakPassword as exc:
        raise StaffError(str(exc)) from exc
    hashed = await passwords.hash_password(password)
    row = await db.fetchrow(
        """
        INSERT INTO users (email, password_hash, verified_at, is_staff) VALUES ($1, $2, now(), $3)
        ON CONFLICT (email) DO UPDATE SET is_staff = users.is_staff OR excluded.is_staff
        RETURNING id, xmax = 0
        """,
        email,
        hashed,
        staff,
    )
    return int(row[0]), bool(row[1])
