"""Password hashing with Argon2id (argon2-cffi), off the event loop.

Argon2 is deliberately slow (~230 ms of a core here); hashing runs in a worker thread so
that one sign-in does not stall every request this replica is proxying, and at most half
the cores hash at once so that a burst of sign-ins cannot take them all.
"""

from __future__ import annotations

import asyncio
import os

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_HASHER = PasswordHasher()  # argon2-cffi's RFC 9106 "low memory" profile

MIN_LENGTH = 10

#: hashes computed at once by this process: each takes a core for ~230 ms, and the API
#: this replica proxies must keep the others (a burst of sign-ins waits its turn instead)
_HASHING = asyncio.Semaphore(max(1, (os.cpu_count() or 2) // 2))

#: Compared against when the email is unknown, so that a miss costs as much as a hit and
#: response times do not reveal which emails have accounts.
_DUMMY_HASH = _HASHER.hash("not-a-real-password")


class WeakPassword(ValueError):
    """The password is too short; the message says how long it must be."""


def check_strength(password: str) -> None:
    """Raise :class:`WeakPassword` unless ``password`` is acceptable."""
    if len(password) < MIN_LENGTH:
        raise WeakPassword(f"Use a password of at least {MIN_LENGTH} characters.")


async def hash_password(password: str) -> str:
    """The encoded Argon2id hash of ``password``."""
    async with _HASHING:
        return await asyncio.to_thread(_HASHER.hash, password)


async def verify_password(encoded: str | None, password: str) -> bool:
    """Whether ``password`` matches ``encoded`` (None: unknown user, still costs a hash)."""

    def check() -> bool:
        try:
            return _HASHER.verify(encoded or _DUMMY_HASH, password) and encoded is not None
        except (VerificationError, InvalidHashError):
            return False

    async with _HASHING:
        return await asyncio.to_thread(check)
