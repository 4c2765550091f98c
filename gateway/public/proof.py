"""The landing page's proof: how soon a returning conversation gets its first token from each
tier, against recomputing its history, from the latest ``kvgate bench multiturn`` result.

The benchmark's restore probe (``restore`` in its JSON) asks for one conversation of a
given history length once more after its KV was left resident on the GPU, pushed to host
RAM, to the NAS, to the object store, or dropped (recomputed); its time to first token is
the figure a user feels. The landing page shows the longest history measured. When the run
also measured requests/s against a worker with infinite memory (``efficiency_rps_<tier>``,
in its ``figures`` or top level), those shares are shown too. Of the CPU runs (``multiturn.json``, the full one, and
``multiturn_quick.json``) the latest by its recorded ``date`` leads; the GPU run
(``multiturn_cuda.json``) is read apart and told in a sentence: why recompute won where it
did, else how much sooner the fastest tier answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: where a returning conversation's KV was, in the order the chart lists them
PLACES = ("resident", "host", "nas", "object", "recompute")
#: how the page names each place
LABELS = {
    "resident": "resident on the GPU",
    "host": "from host RAM",
    "nas": "from the NAS",
    "object": "from the object store",
    "recompute": "recomputed, no cache",
}
#: the lower tiers by name
NAMES = {"host": "host RAM", "nas": "NAS", "object": "object store"}
#: the CPU runs, the latest recorded leads
STEMS = ("multiturn", "multiturn_quick")
GPU_STEM = "multiturn_cuda"
_EFFICIENCY = "efficiency_rps_"


@dataclass(frozen=True)
class Run:
    """The figures of one multi-turn benchmark run that the landing page shows."""

    name: str
    machine: str
    model: str
    #: when it was measured (the JSON's ``date``, ISO 8601; empty when not recorded)
    date: str
    #: history length of the returning conversation, tokens
    history: int
    #: place (see :data:`PLACES`) -> time to first token, seconds; measured places only
    ttft: dict[str, float]
    #: tier -> requests/s as a share of the same workload with infinite memory
    efficiency: dict[str, float]
    #: prefill tokens/s, the fastest lower tier's restore bytes/s and the restore rate that
    #: would beat prefill, at :attr:`history`
    prefill_tps: float | None = None
    restore_bytes_per_s: float | None = None
    break_even_bytes_per_s: float | None = None

    @property
    def day(self) -> str:
        """The day it was measured (``YYYY-MM-DD``), or empty."""
        return self.date[:10]

    @property
    def fastest_tier(self) -> str | None:
        """The quickest lower tier (host, NAS, object store) this run measured."""
        lower = [p for p in ("host", "nas", "object") if p in self.ttft]
        return min(lower, key=self.ttft.__getitem__) if lower else None

    @property
    def recompute_won(self) -> bool:
        """Whether recomputing beat every lower tier (the claim does not hold on this run)."""
        tier = self.fastest_tier
        return (
            tier is not None
            and "recompute" in self.ttft
            and self.ttft["recompute"] < (self.ttft[tier])
        )


def _machine(m: dict[str, Any]) -> str:
    """``NVIDIA H200 GPU (16 CPU cores)``, ``AMD EPYC CPU (2 cores)``."""
    if m.get("gpu"):
        return f"{m['gpu']} GPU" + (f" ({m['cpus']} CPU cores)" if m.get("cpus") else "")
    cpu = m.get("cpu") or m.get("processor") or "unknown"
    return f"{cpu} CPU" + (f" ({m['cpus']} cores)" if m.get("cpus") else "")


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when the report has a mapping there, else an empty one."""
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    """A figure as the report writes it: a number, or a target's ``{"value": ...}``."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def from_json(name: str, data: dict[str, Any]) -> Run | None:
    """The landing figures of one report; None when it has no restore figure to compare."""
    restore = _dict(data.get("restore"))
    lengths = [k for k, v in restore.items() if str(k).isdigit() and isinstance(v, dict)]
    if not lengths:
        return None
    history = max(lengths, key=int)
    probes = restore[history]
    ttft = {
        place: float(probes[place]["ttft"])
        for place in PLACES
        if isinstance(probes.get(place), dict)
        and not probes[place].get("error")
        and _number(probes[place].get("ttft")) is not None
    }
    if "recompute" not in ttft or len(ttft) < 2:
        return None
    # the report's figures (``figures``), and its target figures, which it copies top level
    found = {**data, **_dict(data.get("figures"))}
    efficiency = {
        key.removeprefix(_EFFICIENCY): share
        for key, value in found.items()
        if key.startswith(_EFFICIENCY) and (share := _number(value)) is not None
    }
    physics = _dict(data.get("physics"))
    prefill = _dict(physics.get("prefill_tokens_per_s"))
    rates = _dict(physics.get("restore_bytes_per_s"))
    run = Run(
        name=name,
        machine=_machine(_dict(data.get("machine"))),
        model=f"{data.get('model', 'unknown model')} ({data.get('engine', '')})".replace(" ()", ""),
        date=str(data.get("date") or ""),
        history=int(history),
        ttft=ttft,
        efficiency=dict(sorted(efficiency.items(), key=lambda kv: _order(kv[0]))),
        prefill_tps=_number(prefill.get(history)),
        break_even_bytes_per_s=_number(physics.get("break_even_bytes_per_s")),
    )
    fastest = run.fastest_tier
    if fastest is not None:
        rate = _number(_dict(rates.get(fastest)).get(history))
        run = replace(run, restore_bytes_per_s=rate)
    return run


def _order(tier: str) -> int:
    return PLACES.index(tier) if tier in PLACES else len(PLACES)


def load(directory: Path | None, stem: str) -> Run | None:
    """The run written as ``<stem>.json`` in ``directory``, if it has landing figures."""
    path = None if directory is None else directory / f"{stem}.json"
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(errors="replace"))
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    return from_json(stem, data)


def headline(directory: Path | None) -> Run | None:
    """The CPU run the landing page leads with: the latest recorded (the full one on a tie)."""
    runs = [run for stem in STEMS if (run := load(directory, stem)) is not None]
    return max(runs, key=lambda run: run.date, default=None)
