"""The stored block: a versioned, self-describing, checksummed container for one KV page.

Layout (little-endian)::

    magic "KVGB" | version u16 | dtype_len u8 | ndim u8 | key 32B | namespace 32B
    | payload_len u64 | shape ndim*u64 | dtype ascii | checksum u64 | payload

The checksum is xxh3_64 over everything before it plus the payload, so a flipped bit in the
header (a shape, a key) is caught as surely as one in the KV itself. :func:`decode` either
returns a verified block or raises :class:`CorruptBlock`; it never hands back bad data.
The payload of a decoded block is a ``memoryview`` into the caller's buffer (no copy).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import xxhash

from tiering.keys import KEY_BYTES

MAGIC = b"KVGB"
VERSION = 1

_FIXED = struct.Struct(f"<4sHBB{KEY_BYTES}s{KEY_BYTES}sQ")
_U64 = struct.Struct("<Q")

#: Element sizes of the dtypes a KV page may hold (names as torch spells them).
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


class CorruptBlock(ValueError):
    """A stored block failed verification; the caller must treat it as a miss and delete it."""


@dataclass(frozen=True)
class Block:
    """One KV page: its key and namespace digest, its tensor shape and dtype, its raw bytes."""

    key: bytes
    namespace: bytes
    dtype: str
    shape: tuple[int, ...]
    payload: memoryview

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes


def make_block(
    key: bytes, namespace: bytes, dtype: str, shape: tuple[int, ...], payload: object
) -> Block:
    """A :class:`Block` after checking that key, dtype, shape and payload size agree."""
    if len(key) != KEY_BYTES or len(namespace) != KEY_BYTES:
        raise ValueError(f"key and namespace must be {KEY_BYTES}-byte digests")
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPE_SIZES)}")
    view = memoryview(payload).cast("B")  # type: ignore[arg-type]
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if view.nbytes != expected:
        raise ValueError(
            f"payload has {view.nbytes} bytes, shape {shape} of {dtype} needs {expected}"
        )
    return Block(key, namespace, dtype, tuple(int(s) for s in shape), view)


def encode_header(block: Block) -> bytes:
    """The header of ``block``, checksum included; write it followed by ``block.payload``."""
    dtype = block.dtype.encode("ascii")
    head = (
        _FIXED.pack(
            MAGIC, VERSION, len(dtype), len(block.shape), block.key, block.namespace, block.nbytes
        )
        + b"".join(_U64.pack(s) for s in block.shape)
        + dtype
    )
    h = xxhash.xxh3_64(head)
    h.update(block.payload)
    return head + _U64.pack(h.intdigest())


def encode(block: Block) -> bytes:
    """``block`` as one contiguous byte string (header + payload)."""
    return encode_header(block) + block.payload


def decode(buf: bytes | bytearray | memoryview, *, expect_key: bytes | None = None) -> Block:
    """Verify and parse one block; raise :class:`CorruptBlock` on any inconsistency.

    ``expect_key`` guards against a block stored under the wrong name (a misplaced file).
    """
    view = memoryview(buf).cast("B")
    if view.nbytes < _FIXED.size:
        raise CorruptBlock(
            f"block truncated: {view.nbytes} bytes, header alone needs {_FIXED.size}"
        )
    magic, version, dtype_len, ndim, key, namespace, plen = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptBlock(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise CorruptBlock(f"unsupported block version {version} (this build reads {VERSION})")
    pos = _FIXED.size
    head_end = pos + 8 * ndim + dtype_len
    if view.nbytes != head_end + 8 + plen:
        raise CorruptBlock(
            f"block is {view.nbytes} bytes, its header declares {head_end + 8 + plen}"
        )
    shape = tuple(_U64.unpack_from(view, pos + 8 * i)[0] for i in range(ndim))
    (checksum,) = _U64.unpack_from(view, head_end)
    payload = view[head_end + 8 :]
    h = xxhash.xxh3_64(view[:head_end])
    h.update(payload)
    if h.intdigest() != checksum:
        raise CorruptBlock("checksum mismatch: the block was damaged in storage or transit")
    try:
        dtype = bytes(view[pos + 8 * ndim : head_end]).decode("ascii")
        block = make_block(bytes(key), bytes(namespace), dtype, shape, payload)
    except (UnicodeDecodeError, ValueError) as exc:  # checksummed yet inconsistent: a bad writer
        raise CorruptBlock(f"inconsistent block header: {exc}") from exc
    if expect_key is not None and block.key != expect_key:
        raise CorruptBlock(
            f"block holds key {block.key.hex()[:16]}…, expected {expect_key.hex()[:16]}…"
        )
    return block
