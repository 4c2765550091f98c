"""Benchmark workers for tests: the tiny random model from the test cache, on a site of
their own (no database, no object store unless a test adds them)."""

from __future__ import annotations

from pathlib import Path

from kvgate.bench.multiturn import stack
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
