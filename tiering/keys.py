"""Page keys: chained SHA-256 digests seeded with a namespace digest.

Each page of ``page_size`` tokens is named by ``sha256(previous_digest || token ids)``, token
ids as little-endian uint32, and the chain starts from the digest of a :class:`Namespace`
(tenant cache salt, model fingerprint, KV dtype, page size, layout, and how the KV was
computed). A page key therefore names the whole prefix up to and including that page, and
two tenants sending the same prompt never share a key — no cross-tenant hits and no timing
side channel.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

#: Length in bytes of every digest used as a key.
KEY_BYTES = 32

_NS_DOMAIN = b"kvgate/namespace/v1\0"  # domain separation: a namespace digest is never a page key


#: Fields left out of the digest while empty, so that adding one kept the digest of every
#: namespace that does not set it (and so the keys of the pages already stored under it).
_OPTIONAL_FIELDS = ("compute",)


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for two pages to be interchangeable.

    A restored page must be exactly what recomputing it would write, so every input of that
    computation besides the tokens belongs here: the weights (``model``, a content
    fingerprint, never a served name), the KV ``dtype``, the page geometry, and ``compute``.
    """

    tenant: str
    #: what identifies the weights the KV was computed with
    model: str
    #: dtype the KV is stored in
    dtype: str
    page_size: int
    layout: str = "layer,token,kv,head,dim"
    #: how the KV was computed beyond the weights: the model's compute dtype and the device
    #: type (``float32@cpu``). The same weights computing in bfloat16, or on CUDA kernels,
    #: write other KV bytes even when the KV dtype matches. Empty: folded in elsewhere.
    compute: str = ""

    def __post_init__(self) -> None:
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")

    @cached_property
    def digest(self) -> bytes:
        """32-byte digest of the canonical JSON form of the fields; seeds every chain.

        Optional fields that are empty are left out, so a namespace that does not set them
        has the digest it had before they existed.
        """
        fields = asdict(self)
        for name in _OPTIONAL_FIELDS:
            if not fields[name]:
                del fields[name]
        canon = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(_NS_DOMAIN + canon).digest()

    def page_keys(self, token_ids: Sequence[int] | np.ndarray) -> list[bytes]:
        """Keys of the full pages of ``token_ids`` in this namespace (a partial tail has none)."""
        return page_keys(self.digest, token_ids, self.page_size)


def page_keys(seed: bytes, token_ids: Sequence[int] | np.ndarray, page_size: int) -> list[bytes]:
    """Chained digests of the full pages of ``token_ids``, the chain seeded with ``seed``:
    every key depends on all the pages before it."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
        raise ValueError("token ids must fit in uint32")
    n_pages = ids.size // page_size
    # One conversion for the whole chain; each page is then a zero-copy slice of it.
    raw = memoryview(ids[: n_pages * page_size].astype("<u4").tobytes())
    step = page_size * 4
    prev = seed
    out: list[bytes] = []
    for i in range(n_pages):
        h = hashlib.sha256(prev)
        h.update(raw[i * step : (i + 1) * step])
        prev = h.digest()
        out.append(prev)
    return out


def chain_keys(items: list[tuple[bytes, tuple[int, ...]]], page_size: int) -> list[bytes]:
    """The key of each ``(namespace digest, token chain)``'s last page.

    Evictions arrive as whole chains; pages of one sequence share their prefix, so each
    chain continues from the longest already-keyed chain it extends instead of rehashing
    from the first token (256 pages of one conversation cost 256 hashes, not 32,896).
    """
    out: list[bytes | None] = [None] * len(items)
    done: dict[tuple[bytes, int], tuple[tuple[int, ...], bytes]] = {}
    for i in sorted(range(len(items)), key=lambda j: len(items[j][1])):
        seed, chain = items[i]
        prev_len, prev_key = 0, seed
        for n in range(len(chain) - page_size, 0, -page_size):
            hit = done.get((seed, n))
            if hit is not None and hit[0] == chain[:n]:
                prev_len, prev_key = n, hit[1]
                break
        key = page_keys(prev_key, chain[prev_len:], page_size)[-1]
        done[(seed, len(chain))] = (chain, key)
        out[i] = key
    return out  # type: ignore[return-value]


def compute_tag(dtype: str, device_type: str) -> str:
    """How an engine on ``device_type`` computing in ``dtype`` makes its KV: ``float32@cpu``,
    the value of :attr:`Namespace.compute`.

    Only the device type counts (``cuda:1`` and ``cuda:0`` run the same kernels).
    """
    return f"{dtype}@{device_type}"
