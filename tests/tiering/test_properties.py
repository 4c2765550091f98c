"""Properties of the codec and the page keys over generated inputs (seeded, bounded).

What a restored page is must never be in doubt: any block round-trips exactly, any damage
to its bytes is caught, and a key names exactly one namespace and token prefix.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.codec import CorruptBlock, decode, encode, make_block
from tiering.keys import Namespace, chain_keys, page_keys

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)

namespaces = st.builds(
    Namespace,
    tenant=st.text(max_size=12),
    model=st.text(min_size=1, max_size=12),
    dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    page_size=st.integers(1, 8),
    compute=st.sampled_from(["", "float32@cpu", "bfloat16@cuda"]),
)
token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=40)


def _block(ns: Namespace, ids: list[int], values: list[float]):
    key = page_keys(ns.digest, [*ids, 0], 1)[-1]
    array = np.asarray(values, dtype=np.float16).reshape(1, len(values))
    return make_block(key, ns.digest, "float16", array.shape, array)


@SETTINGS
@given(namespaces, token_ids, st.lists(st.floats(-1e4, 1e4, width=16), min_size=1, max_size=64))
def test_any_block_round_trips_exactly(ns: Namespace, ids: list[int], values: list[float]) -> None:
    block = _block(ns, ids, values)
    out = decode(bytearray(encode(block)), expect_key=block.key)
    assert (out.key, out.namespace, out.dtype, out.shape) == (
        block.key,
        block.namespace,
        block.dtype,
        block.shape,
    )
    assert bytes(out.payload) == bytes(block.payload)


@SETTINGS
@given(
    namespaces,
    st.lists(st.floats(-1e4, 1e4, width=16), min_size=1, max_size=32),
    st.data(),
)
def test_any_damage_is_caught(ns: Namespace, values: list[float], data: st.DataObject) -> None:
    raw = bytearray(encode(_block(ns, [1, 2], values)))
    where = data.draw(st.integers(0, len(raw) - 1))
    cut = data.draw(st.booleans())
    damaged = raw[:where] if cut else raw[:where] + bytes([raw[where] ^ 0x5A]) + raw[where + 1 :]
    try:
        decode(bytearray(damaged), expect_key=_block(ns, [1, 2], values).key)
    except CorruptBlock:
        return
    raise AssertionError(f"{'truncation' if cut else 'flip'} at byte {where} went unnoticed")


@SETTINGS
@given(namespaces, namespaces, token_ids, token_ids)
def test_a_key_names_one_namespace_and_one_prefix(
    a: Namespace, b: Namespace, ids: list[int], other: list[int]
) -> None:
    size = a.page_size
    keys = page_keys(a.digest, ids, size)
    assert len(keys) == len(ids) // size
    assert page_keys(a.digest, ids[: size * (len(keys) // 2)], size) == keys[: len(keys) // 2]
    if a != b:
        assert not set(keys) & set(page_keys(b.digest, ids, b.page_size))
    for n, key in enumerate(page_keys(a.digest, other, size), 1):
        if other[: n * size] != ids[: n * size]:
            assert key not in keys
    chains = [(a.digest, tuple(ids[: n * size])) for n in range(1, len(keys) + 1)]
    assert chain_keys(chains, size) == keys
