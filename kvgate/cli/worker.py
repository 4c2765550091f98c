"""``kvgate worker``: serve one model with the built-in torch engine over HTTP.

With no ``--model`` it serves SmolLM2-135M-Instruct (fetched once) as the model id
``smollm2-135m-instruct``. It prints ``worker ready at http://HOST:PORT model=ID`` once the
socket accepts connections (``kvgate up`` waits for that, then probes ``GET /health``).
SIGTERM or Ctrl-C stop accepting, let running requests finish, then stop the engine.
With tiers (the default), evicted KV pages go to host RAM, the NAS and S3 (when an endpoint
is configured, with the ledger in Postgres when ``DATABASE_URL`` is set) and come back on a
prefix hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from importlib.metadata import version

import click
import uvicorn

from kvgate.cli.worker_sglang import EngineSwitch
from kvgate.settings import load_settings
from kvgate.wiring.engine import (
    LoadedModel,
    WorkerOptions,
    load_model,
    running_engine,
    serving_process,
    worker_options,
)
from workers.context import ServerConfig
from workers.engine.engine import TorchEngine
from workers.engine.tiered_offload import TieredOffload
from workers.server import create_app

#: Seconds running requests get to finish after SIGTERM before the server closes them.
GRACEFUL_SHUTDOWN_S = 30

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """uvicorn, announcing the bound address once it really listens, exiting 0 on SIGTERM."""

    def __init__(self, config: uvicorn.Config, model_id: str) -> None:
        super().__init__(config)
        self.model_id = model_id

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            click.echo(f"worker ready at http://{host}:{port} model={self.model_id}")

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises SIGTERM/SIGINT after its graceful drain, killing the process
        # before the engine is closed; a drained worker should instead stop cleanly (exit 0).
        handlers = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


@click.command(cls=EngineSwitch)  # --engine sglang hands over to `kvgate worker-sglang`
@click.option(
    "--model", help="GGUF file, safetensors dir, tiny-random or random:<preset> (default: SmolLM2)."
)
@click.option("--host", help="Bind address (default: KVGATE_BIND_HOST).")
@click.option("--port", type=int, help="Port; 0 picks a free one (default: KVGATE_WORKER_PORT).")
@click.option("--kv-pool-bytes", type=int, help="Bytes of the device KV pool.")
@click.option("--page-size", type=int, help="Tokens per KV page (default 16).")
@click.option("--max-batch", type=int, help="Most requests decoding at once.")
@click.option("--token-budget", type=int, help="Most tokens in one engine step.")
@click.option("--device", help="torch device: auto, cpu, cuda, cuda:1 ...")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    help="Weights and activations (default: KVGATE_WORKER_DTYPE; auto: fp32 on CPU, bf16 on CUDA).",
)
@click.option(
    "--kv-dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    help="KV cache (default: KVGATE_WORKER_KV_DTYPE; auto: fp16 on CPU, the model's on CUDA).",
)
@click.option(
    "--tiers/--no-tiers",
    default=None,
    help="Spill evicted KV to host RAM, the NAS and S3 (when configured) and fetch it back "
    "(default: KVGATE_WORKER_TIERS).",
)
def worker(host: str | None, port: int | None, tiers: bool | None, **engine_flags: object) -> None:
    """Serve a model with the built-in engine (OpenAI and SGLang-native HTTP API)."""
    settings = load_settings()
    options = serving_process(worker_options(settings, **engine_flags))
    loaded = load_model(options)
    use_tiers = settings.worker_tiers if tiers is None else tiers
    with running_engine(loaded, options, settings if use_tiers else None) as engine:
        port = settings.worker_port if port is None else port
        _serve(engine, loaded, options, host or settings.bind_host, port)


def _serve(
    engine: TorchEngine, loaded: LoadedModel, options: WorkerOptions, host: str, port: int
) -> None:
    """Serve ``engine`` until SIGTERM/SIGINT, then let running requests finish."""
    info = {
        "version": version("kvgate"),
        "model": options.model or loaded.model_id,
        "device": options.engine.device,
        "dtype": options.engine.dtype,
        "kv_dtype": options.engine.kv_dtype,
        "kv_pool_bytes": options.engine.kv_pool_bytes,
        "page_size": options.engine.page_size,
        "max_batch": options.engine.max_batch,
        "token_budget": options.engine.token_budget,
        "tiers": isinstance(engine.offload, TieredOffload),
    }
    tier_stats = engine.offload.stats if isinstance(engine.offload, TieredOffload) else None
    config = ServerConfig(server_info=info, tier_stats=tier_stats)
    app = create_app(engine, loaded.tokenizer, loaded.chat_template, config)
    server = uvicorn.Config(
        app, host=host, port=port, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, log_level="info"
    )
    asyncio.run(_Server(server, loaded.model_id).serve())
