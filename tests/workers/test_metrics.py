"""The tokens/s gauges: a rate over a sliding window, driven here by an explicit clock."""

from __future__ import annotations

from workers.metrics import RateMeter


def test_rate_counts_only_the_window() -> None:
    now = [100.0]
    meter = RateMeter(window_s=10.0, clock=lambda: now[0])
    meter.add(50)
    now[0] = 105.0
    meter.add(30)
    assert meter.rate() == 8.0  # 80 tokens over the 10 s window
    now[0] = 112.0  # the first sample is older than the window now
    assert meter.rate() == 3.0
    now[0] = 200.0
    assert meter.rate() == 0.0
