"""API key secrets: how they look, how they are made, and what of them is stored.

A key is ``kvg_`` followed by 32 random bytes in URL-safe base64 (43 characters). Only its
SHA-256 and a short visible prefix are stored: the secret has 256 bits of entropy, so a
fast hash is as safe as a slow one and keeps every lookup cheap.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "kvg_"
_SECRET_BYTES = 32
_PREFIX_CHARS = 12  # "kvg_" + 8 characters: enough to tell keys apart in a list
_SHAPE = re.compile(r"^kvg_[A-Za-z0-9_-]{43,128}$")


@dataclass(frozen=True)
class NewKey:
    """A freshly minted key: the secret (shown once) and what the database keeps."""

    secret: str
    prefix: str
    key_hash: bytes


def mint() -> NewKey:
    """A new random key."""
    secret = KEY_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    return NewKey(secret, visible_prefix(secret), hash_key(secret))


def well_formed(secret: str) -> bool:
    """Whether ``secret`` has the shape of a kvgate key (cheap check before any lookup)."""
    return _SHAPE.fullmatch(secret) is not None


def hash_key(secret: str) -> bytes:
    """The stored form of ``secret``."""
    return hashlib.sha256(secret.encode()).digest()


def visible_prefix(secret: str) -> str:
    """The part of a key that may be shown in lists and logs."""
    return secret[:_PREFIX_CHARS]
