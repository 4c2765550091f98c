"""Where each page of a key chain is: the longest prefix found in the tiers below the device.

Host RAM answers from memory. Below it one ledger round trip (Postgres) places each page
on the NAS or in the object store; without a ledger, or when it does not answer in time,
the NAS itself is asked. The answer is a claim, which a fetch verifies by reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from protocol.tiers import TierName
from tiering.failures import FailureLog
from tiering.ledger import NAS, OBJECT, Ledger
from tiering.tiers.base import Tier
from tiering.tiers.host import HostTier


class Locator:
    """Lookups over ``tiers`` (host RAM first, then whichever of ``nas``/``object`` exist)."""

    def __init__(
        self,
        host: HostTier,
        tiers: Mapping[str, Tier],
        ledger: Ledger | None,
        *,
        timeout_s: float,
        failures: FailureLog,
    ) -> None:
        """``timeout_s`` bounds the ledger's (or the NAS's) answer; failures are recorded."""
        self.host = host
        self.tiers = tiers
        self.ledger = ledger
        self.timeout_s = timeout_s
        self.failures = failures

    async def lookup(self, namespace: bytes, keys: Sequence[bytes]) -> list[str]:
        """The tier holding each page of the longest prefix of ``keys`` found anywhere."""
        n_host = self.host.prefix_now(keys)
        plan = [TierName.HOST] * n_host
        rest = keys[n_host:]
        if not rest or len(self.tiers) == 1:
            return plan
        lower = await self._lower_prefix(namespace, rest)
        # host RAM may have dropped pages while the ledger answered; the prefix ends there
        n_still = self.host.prefix_now(keys[:n_host])
        if n_still < n_host:
            return plan[:n_still]
        for key, tier in zip(rest, lower, strict=False):
            plan.append(TierName.HOST if key in self.host else tier)
        return plan

    async def _lower_prefix(self, namespace: bytes, keys: Sequence[bytes]) -> list[str]:
        if self.ledger is not None:
            try:
                bits = await asyncio.wait_for(self.ledger.prefix(namespace, keys), self.timeout_s)
            except Exception as exc:  # Postgres down: fall through to asking the NAS
                self.failures.record("ledger", "lookup", exc)
            else:
                usable = []
                for b in bits:
                    if b & NAS and TierName.NAS in self.tiers:
                        usable.append(TierName.NAS)
                    elif b & OBJECT and TierName.OBJECT in self.tiers:
                        usable.append(TierName.OBJECT)
                    else:
                        break
                return usable
        nas = self.tiers.get(TierName.NAS)
        if nas is None:
            return []
        try:
            n = await asyncio.wait_for(nas.longest_prefix(keys), self.timeout_s)
        except Exception as exc:
            self.failures.record(TierName.NAS, "lookup", exc)
            return []
        return [TierName.NAS] * n
