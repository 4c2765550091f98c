"""The names of the KV tiers: one type that the ledger, the store, the metrics and the docs use.

A page lives on the tier ladder ``device`` (the worker's KV pool in VRAM, L1) → ``host``
(the worker's RAM, L2) → ``nas`` (a directory every worker mounts, L3) → ``object`` (an
S3 bucket, L4). The first two are private to a worker; the last two are shared, and the
Postgres ledger records which shared tier holds which page as one bit each. The names are
strings on the wire (usage by tier, metric labels, JSON reports), so the type is a
``StrEnum``: ``TierName.NAS == "nas"``.
"""

from __future__ import annotations

from enum import StrEnum


class TierName(StrEnum):
    """One rung of the ladder, named as it appears in reports, metrics and the docs."""

    DEVICE = "device"
    HOST = "host"
    NAS = "nas"
    OBJECT = "object"

    @property
    def level(self) -> str:
        """``L1`` … ``L4``: the rung, counted from the GPU down."""
        return f"L{list(TierName).index(self) + 1}"


#: every tier, from the GPU down
TIERS: tuple[TierName, ...] = tuple(TierName)

#: the tiers below the device, where evicted pages go
LOWER_TIERS: tuple[TierName, ...] = (TierName.HOST, TierName.NAS, TierName.OBJECT)

#: the shared tiers and their bit in ``kv_ledger.tiers`` (migrations/0002_kv_ledger.sql)
LEDGER_BITS: dict[TierName, int] = {TierName.NAS: 1, TierName.OBJECT: 2}
