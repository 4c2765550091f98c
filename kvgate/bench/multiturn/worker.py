"""The built-in worker with a chosen set of lower KV tiers, for ``kvgate bench multiturn``.

The comparison needs the same engine and HTTP server under several tier ladders —
none (evictions dropped), host RAM only, host + NAS, host + NAS + object store — which
``kvgate worker`` does not choose between. This module composes exactly what
``kvgate worker`` composes (:mod:`kvgate.wiring.engine`, :func:`workers.server.create_app`), with
the engine's :class:`~workers.engine.tiered_offload.TieredOffload` over the tiers named by
``--tiers``. Everything else comes from the usual settings (``KVGATE_NAS_PATH``,
``KVGATE_S3_*``, ``KVGATE_TIER_HOST_BYTES``, ``DATABASE_URL``, ``KVGATE_WORKER_*``).

Run as ``python -m kvgate.bench.multiturn.worker --tiers host,nas --port N``; the benchmark waits
for ``GET /health`` and stops it with SIGTERM.
"""

from __future__ import annotations

import click
import uvicorn

from kvgate.settings import load_settings
from kvgate.wiring.engine import load_model, running_engine, serving_process, worker_options
from kvgate.wiring.tiering import object_config
from protocol.tiers import LOWER_TIERS
from workers.context import ServerConfig
from workers.engine.tiered_offload import TieredOffload
from workers.server import create_app


@click.command()
@click.option("--tiers", default="", help="Comma list of lower tiers: host, nas, object.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, required=True)
def main(tiers: str, host: str, port: int) -> None:
    """Serve the default model with the built-in engine over the lower tiers ``--tiers``."""
    chosen = frozenset(t for t in tiers.split(",") if t)
    if unknown := chosen - set(LOWER_TIERS):
        raise click.UsageError(
            f"unknown tiers {sorted(unknown)}; pick from {[str(t) for t in LOWER_TIERS]}"
        )
    settings = load_settings()
    if "object" in chosen and object_config(settings) is None:
        raise click.UsageError("--tiers object needs an S3 endpoint (KVGATE_S3_ENDPOINT)")
    options = serving_process(worker_options(settings))
    loaded = load_model(options)
    with running_engine(
        loaded, options, settings if chosen else None, lower_tiers=chosen
    ) as engine:
        info = {"tiers": sorted(chosen), "kv_pool_bytes": options.engine.kv_pool_bytes}
        stats = engine.offload.stats if isinstance(engine.offload, TieredOffload) else None
        config = ServerConfig(server_info=info, tier_stats=stats)
        app = create_app(engine, loaded.tokenizer, loaded.chat_template, config)
        uvicorn.run(app, host=host, port=port, log_level="warning")


if __name__ == "__main__":
    main()
