"""Benchmark workers for tests: the tiny random model from the test cache, on a site of
their own (no database, no object store unless a test adds them)."""

from __future__ import annotations

from pathlib import Path

from kvgate.bench.multiturn import stack
from kvgate.bench.multiturn.metrics import summarize
from workers.engine.engine import EngineOptions
from workers.engine.weights import tiny_random


def tiny_site(
    nas: Path, smollm2_gguf: Path, *, pool_tokens: int | None = None, **env: str
) -> stack.Site:
    """A site whose workers serve ``tiny-random`` with an L1 of ``pool_tokens`` (default:
    the worker's own) and ``env`` on top; ``smollm2_gguf`` locates the test cache's models."""
    settings = {
        "KVGATE_HOME": str(smollm2_gguf.parent.parent),
        "KVGATE_WORKER_MODEL": "tiny-random",
        "KVGATE_NAS_PATH": str(nas),
    }
    if pool_tokens is not None:
        config, _ = tiny_random()
        token_bytes = EngineOptions(device="cpu").kv_bytes_per_token(config)
        settings["KVGATE_WORKER_KV_POOL_BYTES"] = str(pool_tokens * token_bytes)
    return stack.Site(dsn="", nas=nas, s3_prefix="", env=settings | env)


def recorded_run(**overrides: object) -> dict:
    """A multi-turn run's measurements as the report reads them, with round figures a test
    can check by hand; ``overrides`` replace top-level entries."""
    config = summarize([]).as_dict() | {"rps": 1.0, "ttft_p50": 1.0, "followup_cached_ratio": 0.9}
    sample = {"ttft": 1.0, "prompt_tokens": 4100, "cached_tokens": 4096, "cached_by_tier": {}}
    chat = {
        "infinite": {**config, "rps": 1.05, "ttft_p50": 0.9},
        "recompute": {**config, "rps": 0.1, "ttft_p50": 8.0},
        "host": config,
        "nas": config,
        "object": {**config, "rps": 0.95},
        "gateway_shared": {**config, "followup_cached_ratio": 0.95},
    }
    docqa = {
        "infinite": {**config, "rps": 2.0},
        "recompute": {**config, "rps": 0.1},
        "nas": {**config, "rps": 1.9},
    }
    data = {
        "run": "quick",
        "seconds": 800.0,
        "kv_bytes_per_token": 46080,
        "workloads": {"chat": {"configs": chat}, "docqa": {"configs": docqa}},
        "no_reuse": {
            "on": {"rps": 0.99, "wave_seconds": [60.0, 10.0, 20.0, 30.0]},
            "off": {"rps": 1.0, "wave_seconds": [50.0, 9.95, 19.9, 29.85]},
        },
        "restore": {
            "4000": {
                "resident": {**sample, "ttft": 0.2},
                "host": {**sample, "ttft": 0.2, "cached_by_tier": {"host": 4096}},
                "nas": {**sample, "ttft": 0.21, "cached_by_tier": {"nas": 4096}},
                "object": {**sample, "ttft": 0.9, "cached_by_tier": {"object": 4096}},
                "recompute": {**sample, "ttft": 8.2, "cached_tokens": 0},
            }
        },
    }
    data.update(overrides)
    return data
