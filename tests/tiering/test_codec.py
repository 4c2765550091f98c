"""Block codec: round trips, and every single corrupted byte or truncation is detected."""

from __future__ import annotations

import numpy as np
import pytest

from tiering.codec import (
    DTYPE_SIZES,
    CorruptBlock,
    decode,
    encode,
    encode_header,
    encoded_size,
    make_block,
)
from tiering.keys import Namespace

NS = Namespace(tenant="t", model="m", dtype="float16", page_size=4)


def _block(seed: int = 0):
    key = NS.page_keys([seed, 1, 2, 3])[0]
    arr = np.random.default_rng(seed).standard_normal((2, 2, 4, 3)).astype(np.float16)
    return make_block(key, NS.digest, "float16", arr.shape, arr)


def test_round_trip_preserves_everything_without_copying_payload() -> None:
    block = _block()
    raw = bytearray(encode(block))
    out = decode(raw, expect_key=block.key)
    assert (out.key, out.namespace, out.dtype, out.shape) == (
        block.key,
        block.namespace,
        "float16",
        (2, 2, 4, 3),
    )
    assert bytes(out.payload) == bytes(block.payload)
    raw[-1] ^= 0xFF  # the payload is a view into the buffer we passed
    assert bytes(out.payload) != bytes(block.payload)


def test_header_plus_payload_equals_encode() -> None:
    block = _block(3)
    assert encode_header(block) + bytes(block.payload) == encode(block)


@pytest.mark.parametrize(
    ("dtype", "shape"), [("float16", (2, 2, 4, 3)), ("bfloat16", (7,)), ("float8_e4m3fn", ())]
)
def test_encoded_size_is_the_stored_length_without_hashing(dtype: str, shape: tuple) -> None:
    payload = bytes(int(np.prod(shape)) * DTYPE_SIZES[dtype])
    block = make_block(NS.page_keys([1, 2, 3, 4])[0], NS.digest, dtype, shape, payload)
    assert encoded_size(block) == len(encode(block))


def test_every_flipped_byte_is_detected() -> None:
    raw = encode(_block(1))
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        with pytest.raises(CorruptBlock):
            decode(bad)


@pytest.mark.parametrize("cut", [0, 3, 40, 100, -1])
def test_truncated_and_extended_blocks_are_detected(cut: int) -> None:
    raw = encode(_block(2))
    with pytest.raises(CorruptBlock):
        decode(raw[:cut])
    with pytest.raises(CorruptBlock):
        decode(raw + b"\0")


def test_block_under_the_wrong_key_is_corrupt() -> None:
    block = _block(4)
    with pytest.raises(CorruptBlock, match="expected"):
        decode(encode(block), expect_key=_block(5).key)


def test_make_block_rejects_mismatched_sizes_and_unknown_dtypes() -> None:
    key = NS.page_keys([1, 2, 3, 4])[0]
    with pytest.raises(ValueError, match="needs"):
        make_block(key, NS.digest, "float16", (3,), b"\0" * 4)
    with pytest.raises(ValueError, match="unsupported dtype"):
        make_block(key, NS.digest, "complex64", (1,), b"\0" * 8)
