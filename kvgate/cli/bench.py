"""``kvgate bench``: benchmarks that print their figures and write them under docs/benchmarks/.

Speed is measured here, never asserted in tests. Each benchmark lives in its own module,
imported only when run (they pull in torch, transformers, a database...); adding one means
adding one line to the table below.
"""

from __future__ import annotations

import click

from kvgate.cli import LazyGroup

#: benchmark name -> "module:attribute" of its click command
BENCHMARKS: dict[str, str] = {
    "engine": "kvgate.bench.engine:engine",
    "multiturn": "kvgate.bench.multiturn.command:multiturn",
    "tiers": "kvgate.bench.tiers:tiers",
    "gateway": "kvgate.bench.gateway:bench_gateway",
    "sglang": "kvgate.bench.sglang:sglang",
    "soak": "kvgate.bench.soak:soak",
    "faults": "kvgate.bench.faults.command:faults",
}


class BenchGroup(LazyGroup):
    """``kvgate bench`` subcommands, imported on first use."""

    table = BENCHMARKS


@click.group(cls=BenchGroup)
def bench() -> None:
    """Measure a part of kvgate; figures are printed and written to docs/benchmarks/."""
