"""Tier names: one type, spelled on the wire as plain strings, with the ledger's bits."""

from __future__ import annotations

import json

import orjson

from protocol.streaming import sse
from protocol.tiers import LEDGER_BITS, LOWER_TIERS, TIERS, TierName


def test_the_ladder_runs_from_the_gpu_down_and_the_shared_tiers_own_a_bit_each() -> None:
    assert [t.value for t in TIERS] == ["device", "host", "nas", "object"]
    assert [t.level for t in TIERS] == ["L1", "L2", "L3", "L4"]
    assert TIERS[1:] == LOWER_TIERS
    assert set(LEDGER_BITS) == {TierName.NAS, TierName.OBJECT}
    bits = list(LEDGER_BITS.values())
    assert all(b & (b - 1) == 0 for b in bits) and len(set(bits)) == len(bits)


def test_a_tier_name_is_its_string_in_dicts_json_and_events() -> None:
    counts = {TierName.NAS: 3}
    assert counts["nas"] == 3 and TierName("object") is TierName.OBJECT
    assert json.loads(json.dumps(counts)) == {"nas": 3}
    event = sse({"cached_tokens_by_tier": dict.fromkeys(TIERS, 0)})
    assert orjson.loads(event.removeprefix(b"data: "))["cached_tokens_by_tier"] == {
        "device": 0,
        "host": 0,
        "nas": 0,
        "object": 0,
    }
