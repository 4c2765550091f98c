"""``kvgate tierd``: keep the NAS and the object store within their limits (see tiering.tierd)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal

import click
from prometheus_client import start_http_server

from kvgate.settings import Settings, load_settings
from kvgate.stack.postgres import create_pool
from kvgate.wiring.database import settings_database
from kvgate.wiring.tiering import nas_config, object_config, tierd_config
from tiering.tierd import Tierd
from tiering.tierd_metrics import TierdMetrics
from tiering.tiers.nas import NasTier
from tiering.tiers.object import ObjectTier


async def _run(settings: Settings, dsn: str, once: bool) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=4)
    nas = NasTier(nas_config(settings))
    obj_cfg = object_config(settings)
    obj = await ObjectTier(obj_cfg).start() if obj_cfg else None
    config = tierd_config(settings)
    tierd = Tierd(pool, nas, obj, config)
    try:
        if once:
            report = await tierd.run_pass()
            click.echo(json.dumps(dataclasses.asdict(report)))
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        metrics = TierdMetrics(config)
        if settings.tierd_metrics_port:
            try:
                start_http_server(
                    settings.tierd_metrics_port, settings.bind_host, registry=metrics.registry
                )
            except OSError as exc:  # metrics are for watching; tierd's work goes on
                click.echo(f"tierd: no /metrics on port {settings.tierd_metrics_port}: {exc}")
        click.echo(
            f"tierd: NAS {settings.nas_dir}, object store "
            f"{obj_cfg.endpoint_url + '/' + obj_cfg.bucket if obj_cfg else 'none'}, "
            f"pass every {settings.tierd_interval_s:g}s"
        )
        await tierd.run_forever(stop, metrics.observe)
    finally:
        if obj is not None:
            await obj.close()
        nas.close()
        await pool.close()


@click.command()
@click.option("--once", is_flag=True, help="Run a single pass, print its report as JSON, exit.")
def tierd(once: bool) -> None:
    """Demote cold KV pages NAS -> S3, enforce capacity/quotas, collect orphans.

    Serves Prometheus metrics on KVGATE_TIERD_METRICS_PORT (passes, pages moved, the
    shared tiers' sizes and limits) unless it is 0 or --once is given.

    Without an S3 endpoint, pages above the NAS watermark are deleted instead of demoted.
    Several tierd processes may run at once; each pass is taken by one of them.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings()
    if not settings.nas_dir.is_dir():
        raise click.ClickException(
            f"NAS directory {settings.nas_dir} does not exist: create it or set KVGATE_NAS_PATH"
        )
    with settings_database(settings) as dsn:
        asyncio.run(_run(settings, dsn, once))
