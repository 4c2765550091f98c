"""docs/metrics.md lists every metric the gateway, the workers and tierd export, and no other.

The registries are built in-process as each process builds them (a worker over an engine
that reports an idle load, with one tier), and read back through the text exposition.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics, ReplicaState
from tiering.tierd import TierdConfig
from tiering.tierd_metrics import TierdMetrics
from tiering.tiers.base import TierStats
from workers.engine.api import EngineLoad
from workers.metrics import ServerMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


class IdleEngine:
    """What ``ServerMetrics`` reads of an engine: its load."""

    def load(self) -> EngineLoad:
        return EngineLoad(
            running=0, queued=0, pool_used_pages=0, pool_total_pages=1, cached_pages=0
        )


def exported() -> dict[str, str]:
    """Every metric name as scraped -> the process exporting it."""
    gateway = GatewayMetrics()
    gateway.watch(ReplicaState(lambda: 0, lambda: 0, lambda: 0))
    tiers = {"tiers": {"host": TierStats("host")}, "store": {}, "failures": {}, "write_queue": 0}
    worker = ServerMetrics(IdleEngine(), lambda: tiers)  # type: ignore[arg-type]
    tierd = TierdMetrics(TierdConfig())
    names = {}
    for process, registry in (
        ("gateway", gateway.registry),
        ("worker", worker.registry),
        ("tierd", tierd.registry),
    ):
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            suffix = "_total" if family.type == "counter" else ""
            names[family.name + suffix] = process
    return names


def documented() -> dict[str, str]:
    """Name -> process, from the table's first two columns."""
    rows = re.findall(r"^\| `(kvgate_\w+)` \| (\w+) \|", DOC.read_text(), re.M)
    return dict(rows)


def test_the_metrics_table_is_exactly_what_is_exported() -> None:
    assert documented() == exported()


def test_names_follow_prometheus_conventions() -> None:
    for name in exported():
        assert name.startswith("kvgate_")
        assert not re.search(r"_(ms|milliseconds|kb|mb|gb|percent)(_|$)", name), name
