"""Page keys: the chain is seeded by the namespace and each key covers the whole prefix."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import numpy as np
import pytest

from tiering.keys import Namespace, chain_keys, page_keys

NS = Namespace(tenant="team-a", model="smollm2-135m@abc", dtype="bfloat16", page_size=4)


def test_first_key_is_seeded_with_namespace_and_later_keys_chain() -> None:
    ids = list(range(100, 112))
    keys = NS.page_keys(ids)
    assert len(keys) == 3
    first = hashlib.sha256(NS.digest + struct.pack("<4I", *ids[:4])).digest()
    assert keys[0] == first
    assert keys[1] == hashlib.sha256(first + struct.pack("<4I", *ids[4:8])).digest()


def test_partial_tail_page_gets_no_key_and_prefixes_share_keys() -> None:
    ids = list(range(50))
    assert NS.page_keys(ids[:10]) == NS.page_keys(ids)[:2]


def test_changing_an_early_token_changes_every_later_key() -> None:
    ids = list(range(16))
    other = [*ids[:1], 999, *ids[2:]]
    assert not set(NS.page_keys(ids)) & set(NS.page_keys(other))


@pytest.mark.parametrize(
    "field,value",
    [
        ("tenant", "team-b"),
        ("model", "other"),
        ("dtype", "float16"),
        ("layout", "x"),
        ("compute", "float32@cpu"),
    ],
)
def test_namespaces_differing_in_any_field_share_no_keys(field: str, value: str) -> None:
    other = dataclasses.replace(NS, **{field: value})
    ids = list(range(32))
    assert other.digest != NS.digest
    assert not set(NS.page_keys(ids)) & set(other.page_keys(ids))


def test_compute_scopes_keys_and_an_unset_compute_keeps_the_old_digest() -> None:
    # The same weights and KV dtype computed in float32 or bfloat16 write other KV bytes.
    f32, bf16 = (dataclasses.replace(NS, compute=c) for c in ("float32@cpu", "bfloat16@cpu"))
    assert f32.digest != bf16.digest
    assert not set(f32.page_keys(range(8))) & set(bf16.page_keys(range(8)))
    # Without one, the digest is what it was before the field existed: stored pages stay keyed.
    canon = b'{"dtype":"bfloat16","layout":"layer,token,kv,head,dim","model":"smollm2-135m@abc",'
    canon += b'"page_size":4,"tenant":"team-a"}'
    assert NS.digest == hashlib.sha256(b"kvgate/namespace/v1\0" + canon).digest()


def test_numpy_input_matches_lists() -> None:
    ids = np.arange(4 * 256, dtype=np.int32)
    keys = page_keys(NS.digest, ids, 4)
    assert len(keys) == 256
    assert page_keys(NS.digest, ids.tolist(), 4) == keys


def test_token_ids_outside_uint32_are_rejected() -> None:
    with pytest.raises(ValueError, match="uint32"):
        NS.page_keys([-1, 0, 0, 0])


def test_chain_keys_continue_from_shared_prefixes_and_agree_with_page_keys() -> None:
    other = Namespace("tenant-b", "model-x", "float16", 4)
    base = tuple(range(12))
    chains = [
        (NS.digest, base),
        (NS.digest, base[:8]),
        (NS.digest, (*base, 90, 91, 92, 93)),
        (NS.digest, (*base[:8], 7, 7, 7, 7)),  # shares 8 tokens, then leaves the path
        (other.digest, base),  # same tokens, another seed: no reuse across namespaces
    ]
    expected = [page_keys(seed, chain, 4)[-1] for seed, chain in chains]
    assert chain_keys(list(chains), 4) == expected
