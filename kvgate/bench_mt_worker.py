"""The built-in worker with a chosen set of lower KV tiers, for ``kvgate bench multiturn``.

The comparison needs the same engine and HTTP server under several tier ladders —
none (evictions dropped), host RAM only, host + NAS, host + NAS + object store — which
``kvgate worker`` does not choose between. This module composes exactly what
``kvgate worker`` composes (:mod:`kvgate.serving`, :func:`workers.server.create_app`) and
adds a :class:`~workers.engine.tiered_offload.TieredOffload` over the tiers named by
``--tiers``. Everything else comes from the usual settings (``KVGATE_NAS_PATH``,
``KVGATE_S3_*``, ``KVGATE_TIER_HOST_BYTES``, ``DATABASE_URL``, ``KVGATE_WORKER_*``).

Run as ``python -m kvgate.bench_mt_worker --tiers host,nas --port N``; the benchmark waits
for ``GET /health`` and stops it with SIGTERM.
"""

from __future__ import annotations

import contextlib

import click
import uvicorn

from kvgate.services.postgres import create_pool
from kvgate.serving import kv_layout, load_model, worker_options
from kvgate.settings import Settings, load_settings
from kvgate.tiering_setup import cost_config, nas_config, object_config, store_config
from tiering.cost import CostModel
from tiering.ledger import Ledger
from tiering.pinned import host_copy_in
from tiering.store import LOWER_TIERS, TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasTier
from tiering.tiers.object import ObjectTier
from workers.context import ServerConfig
from workers.engine.engine import TorchEngine
from workers.engine.tiered_offload import TieredOffload
from workers.server import create_app


async def build_store(settings: Settings, tiers: frozenset[str]) -> TieredStore:
    """A tiered store holding only ``tiers`` (``host`` is always there: it is the spill path).

    The ledger is used whenever a shared tier is, so that two workers find each other's pages.
    """
    stack = contextlib.AsyncExitStack()
    nas = obj = ledger = None
    if "nas" in tiers:
        settings.nas_dir.mkdir(parents=True, exist_ok=True)
        nas = NasTier(nas_config(settings))
        stack.callback(nas.close)
    if "object" in tiers:
        cfg = object_config(settings)
        if cfg is None:
            raise click.UsageError("--tiers object needs an S3 endpoint (KVGATE_S3_ENDPOINT)")
        obj = ObjectTier(cfg)
        stack.push_async_callback(obj.close)
    if (nas or obj) and settings.database_url is not None:
        pool = await create_pool(settings.database_url.get_secret_value(), min_size=0, max_size=4)
        stack.push_async_callback(pool.close)
        ledger = Ledger(pool)
    return TieredStore(
        HostTier(settings.tier_host_bytes, copy_in=host_copy_in()),
        nas=nas,
        obj=obj,
        ledger=ledger,
        cost=CostModel(cost_config(settings)),
        config=store_config(settings),
        resources=stack,
    )


@click.command()
@click.option("--tiers", default="", help="Comma list of lower tiers: host, nas, object.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, required=True)
def main(tiers: str, host: str, port: int) -> None:
    """Serve the default model with the built-in engine over the lower tiers ``--tiers``."""
    chosen = frozenset(t for t in tiers.split(",") if t)
    if unknown := chosen - set(LOWER_TIERS):
        raise click.UsageError(f"unknown tiers {sorted(unknown)}; pick from {LOWER_TIERS}")
    settings = load_settings()
    options = worker_options(settings)
    loaded = load_model(options)
    engine: TorchEngine | None = None

    def prefill_stats() -> tuple[int, float]:
        # Read without the engine's step lock: this runs on the engine thread mid-step.
        s = engine.scheduler.stats if engine else None
        return (s.prefill_tokens, s.prefill_seconds) if s else (0, 0.0)

    offload = None
    if chosen:
        offload = TieredOffload(
            lambda: build_store(settings, chosen),
            model_fingerprint=loaded.model_id,
            layout=kv_layout(loaded.config, options.engine),
            fetch_timeout_s=max(settings.tier_deadline_nas_s, settings.tier_deadline_object_s) + 1,
            prefill_stats=prefill_stats,
        )
    engine = TorchEngine(
        loaded.config, loaded.state, options.engine, model_id=loaded.model_id, offload=offload
    )
    info = {"tiers": sorted(chosen), "kv_pool_bytes": options.engine.kv_pool_bytes}
    config = ServerConfig(info, tier_stats=offload.stats if offload is not None else None)
    app = create_app(engine, loaded.tokenizer, loaded.chat_template, config)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.close()
        if offload is not None:
            offload.close()


if __name__ == "__main__":
    main()
