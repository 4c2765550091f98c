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
from collections.abc import Sequence
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


def _head(key: bytes, namespace: bytes, dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The header's fields: everything before the checksum."""
    name = dtype.encode("ascii")
    fixed = _FIXED.pack(MAGIC, VERSION, len(name), len(shape), key, namespace, nbytes)
    return fixed + b"".join(_U64.pack(s) for s in shape) + name


def encode_header(block: Block) -> bytes:
    """The header of ``block``, checksum included; write it followed by ``block.payload``."""
    head = _head(block.key, block.namespace, block.dtype, block.shape, block.nbytes)
    return head + _U64.pack(checksum([head, block.payload]))


def encoded_size(block: Block) -> int:
    """The bytes ``block`` takes stored: its header (checksum included) plus its payload,
    from the header's fields alone (no checksum pass)."""
    return _FIXED.size + 8 * len(block.shape) + len(block.dtype) + 8 + block.nbytes


def encode(block: Block) -> bytes:
    """``block`` as one contiguous byte string (header + payload)."""
    return encode_header(block) + block.payload


@dataclass(frozen=True)
class _Header:
    key: bytes
    namespace: bytes
    dtype: str
    shape: tuple[int, ...]
    payload_len: int
    checksum: int
    #: bytes covered by the checksum before the payload (the header without its checksum)
    covered: int


def _parse_header(view: memoryview) -> _Header:
    """The fields of the header at the start of ``view``; raise :class:`CorruptBlock`."""
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
    covered = pos + 8 * ndim + dtype_len
    if view.nbytes < covered + 8:
        raise CorruptBlock(f"block truncated: {view.nbytes} bytes, header needs {covered + 8}")
    shape = tuple(_U64.unpack_from(view, pos + 8 * i)[0] for i in range(ndim))
    try:
        dtype = bytes(view[pos + 8 * ndim : covered]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptBlock(f"inconsistent block header: {exc}") from exc
    (checksum,) = _U64.unpack_from(view, covered)
    return _Header(bytes(key), bytes(namespace), dtype, shape, plen, checksum, covered)


def checksum(parts: Sequence[memoryview | bytes]) -> int:
    """The xxh3-64 of ``parts`` in order: a block's checksum when they are its header's
    covered bytes and its payload."""
    h = xxhash.xxh3_64()
    for part in parts:
        h.update(part)
    return h.intdigest()


def _check_sum(head: _Header, view: memoryview, payload: memoryview) -> None:
    if checksum([view[: head.covered], payload]) != head.checksum:
        raise CorruptBlock("checksum mismatch: the block was damaged in storage or transit")


def _check_key(found: bytes, expect: bytes) -> None:
    if found != expect:
        raise CorruptBlock(f"block holds key {found.hex()[:16]}…, expected {expect.hex()[:16]}…")


def decode(buf: bytes | bytearray | memoryview, *, expect_key: bytes | None = None) -> Block:
    """Verify and parse one block; raise :class:`CorruptBlock` on any inconsistency.

    ``expect_key`` guards against a block stored under the wrong name (a misplaced file).
    """
    view = memoryview(buf).cast("B")
    head = _parse_header(view)
    total = head.covered + 8 + head.payload_len
    if view.nbytes != total:
        raise CorruptBlock(f"block is {view.nbytes} bytes, its header declares {total}")
    payload = view[head.covered + 8 :]
    _check_sum(head, view, payload)
    try:
        block = make_block(head.key, head.namespace, head.dtype, head.shape, payload)
    except ValueError as exc:  # checksummed yet inconsistent: a bad writer
        raise CorruptBlock(f"inconsistent block header: {exc}") from exc
    if expect_key is not None:
        _check_key(block.key, expect_key)
    return block


class PageCheck:
    """Verifies blocks read straight into their final memory, for one namespace, dtype and
    shape: the header expected of each key is known up front, so a block is checked with
    three byte comparisons and one checksum pass instead of a parse.

    The key derives from the namespace, which covers dtype and shape, so a block under a
    key that differs from the expected header anywhere is as wrong as a bad checksum.
    """

    def __init__(self, namespace: bytes, dtype: str, shape: tuple[int, ...]) -> None:
        self.namespace, self.dtype, self.shape = namespace, dtype, tuple(shape)
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPE_SIZES)}")
        self.payload_bytes = math.prod(self.shape) * DTYPE_SIZES[dtype]
        head = _head(bytes(KEY_BYTES), namespace, dtype, self.shape, self.payload_bytes)
        self._before_key = head[:8]
        self._after_key = head[8 + KEY_BYTES :]
        self.header_bytes = len(head) + 8

    @property
    def covered(self) -> int:
        """Bytes of the header before its checksum (the checksum covers them, then the
        payload)."""
        return self.header_bytes - 8

    def verify(self, header: memoryview, key: bytes, checksum: int) -> None:
        """Raise :class:`CorruptBlock` unless ``header`` is ``key``'s and ``checksum`` (of
        the header's covered bytes and the payload read with it, :func:`checksum`) is the
        one it records."""
        covered = self.covered
        if (
            header[:8] != self._before_key
            or header[8 : 8 + KEY_BYTES] != key
            or header[8 + KEY_BYTES : covered] != self._after_key
        ):
            self._explain(header, key)
        if checksum != _U64.unpack_from(header, covered)[0]:
            raise CorruptBlock("checksum mismatch: the block was damaged in storage or transit")

    def _explain(self, header: memoryview, key: bytes) -> None:
        """Raise a :class:`CorruptBlock` that says how ``header`` differs from the expected."""
        head = _parse_header(header)
        _check_key(head.key, key)
        raise CorruptBlock(
            f"block is {head.dtype} {head.shape} of namespace {head.namespace.hex()[:16]}… "
            f"({head.payload_len} bytes), expected {self.dtype} {self.shape} of "
            f"{self.namespace.hex()[:16]}… ({self.payload_bytes} bytes)"
        )
