"""``kvgate bench soak``'s judgement: growth after warm-up, and tiers against their limits."""

from __future__ import annotations

import click
import pytest

from kvgate.bench.soak import LIMITS, MIB, Samples, growth, verdicts


def test_growth_ignores_the_warm_up_and_sees_what_keeps_rising() -> None:
    warm_then_flat = [10, 50, 90, *[100] * 47]
    assert growth(warm_then_flat) == 0.0
    leaking = [100 + 2 * i for i in range(50)]
    assert growth(leaking) > 0.4
    with pytest.raises(click.ClickException, match="too few"):
        growth([1, 2, 3])


def test_verdicts_flag_a_growing_part_and_a_tier_over_its_limit() -> None:
    n = 50
    flat, rising = [80 * MIB] * n, [400 * MIB + i * 4 * MIB for i in range(n)]
    samples = Samples(
        t=list(range(n)),
        # Postgres' backends touching more of the shared buffer cache: RSS rises, USS not
        rss={"gateway": flat, "worker": rising, "postgres": rising},
        uss={"gateway": flat, "worker": rising, "postgres": flat},
        pss={"gateway": flat, "worker": rising, "postgres": rising},
        procs={"gateway": [1] * n, "worker": [1] * n, "postgres": [9] * n},
        fds={"gateway": [30] * n, "worker": [40] * n, "postgres": [300] * n},
        nas=[LIMITS["nas_high"] // 2] * (n - 1) + [LIMITS["nas_high"] * 2],
        objects=[0] * n,
    )
    found = verdicts(samples)
    assert found["parts"]["gateway"]["ok"] and not found["parts"]["worker"]["ok"]
    assert found["parts"]["postgres"]["ok"] and found["parts"]["postgres"]["memory"] == "uss"
    assert not found["tiers"]["ok"]  # the NAS ended above its high watermark
