"""``kvgate worker-sglang`` (also reached as ``kvgate worker --engine sglang``): one GPU under SGLang.

Hashes the weights SGLang will load (:mod:`kvgate.wiring.sglang`: the backend keys every
KV page by them, and the launch is refused when they cannot be found), builds SGLang's
command line with our tiers as its HiCache storage backend, starts it, waits for
``/health``, and keeps it in the worker registry through the worker agent until SIGTERM,
when it drains and stops it. ``--dry-run`` prints the command and exits; it needs neither
SGLang, nor the model, nor a GPU.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

import click

from kvgate.argv import pop_option
from kvgate.settings import Settings, load_settings
from kvgate.wiring.sglang import (
    SGLangWeights,
    WeightsUnavailable,
    kv_numerics,
    resolve_weights,
    split_revision,
)
from tiering.sglang.options import (
    DATABASE_URL_ENV,
    S3_ACCESS_KEY_ENV,
    S3_SECRET_KEY_ENV,
    SGLangBackendOptions,
)
from workers.sglang.command import (
    WRITE_POLICIES,
    SGLangLaunchSpec,
    build_argv,
    build_env,
    format_command,
)

#: Advertised capacity when neither --capacity nor --max-running-requests is given.
DEFAULT_CAPACITY = 64

#: What ``--dry-run`` shows for the weights fingerprint, which only a real launch computes
#: (hashing gigabytes is no dry run). Not a content digest, so a backend given it refuses
#: to start: a printed command run by hand cannot key pages by the name alone.
DRY_RUN_WEIGHTS = "<sha256 of the weights, computed at launch>"


class EngineSwitch(click.Command):
    """``kvgate worker`` with ``--engine builtin|sglang``: sglang hands over to this command.

    The two engines take different flags, so the switch happens before parsing: with
    ``--engine sglang`` the remaining arguments are parsed by :data:`worker_sglang`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.insert(
            0,
            click.Option(
                ["--engine"],
                type=click.Choice(["builtin", "sglang"]),
                default="builtin",
                show_default=True,
                expose_value=False,
                help="builtin: the torch engine here; sglang: SGLang on one GPU "
                "(see `kvgate worker --engine sglang --help`).",
            ),
        )

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        rest, engine = _pop_engine(args)
        if engine == "sglang":
            return worker_sglang.make_context(info_name, rest, parent=parent, **extra)
        # Anything but builtin stays in, so that the option's Choice rejects it by name.
        keep = rest if engine in (None, "builtin") else args
        return super().make_context(info_name, keep, parent=parent, **extra)


def _pop_engine(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without its ``--engine X`` / ``--engine=X`` (before any ``--``), and X."""
    engine, rest = pop_option(args, "--engine", before_dashes=True)
    return rest, engine


def launch_spec(
    settings: Settings, model: str, weights: SGLangWeights | None, **opts: object
) -> SGLangLaunchSpec:
    """The launch spec for ``model`` from the settings and the command-line options.

    ``weights`` (see :mod:`kvgate.wiring.sglang`) gives the backend the fingerprint its
    keys fold in and pins a Hub model's revision; None, for ``--dry-run`` only, shows
    :data:`DRY_RUN_WEIGHTS` in its place, which the backend refuses. The keys also fold in
    the pass-through flags that change the KV those weights compute (``kv_numerics``).
    """
    revision = opts.pop("revision", None)
    backend = SGLangBackendOptions(
        nas_path=str(Path(settings.nas_dir).resolve()),
        s3_endpoint=settings.s3_endpoint,
        s3_bucket=settings.s3_bucket,
        s3_prefix=settings.s3_prefix,
        s3_region=settings.s3_region,
        nas_max_bytes=settings.tier_nas_max_bytes,
        model=str(opts.pop("served_model_name") or model),
        weights_fingerprint=weights.fingerprint if weights else DRY_RUN_WEIGHTS,
        compute=kv_numerics(opts.get("extra_args", ())),  # type: ignore[arg-type]
    )
    return SGLangLaunchSpec(
        model=model,
        backend=backend,
        served_model_name=backend.model if backend.model != model else None,
        revision=(weights.revision if weights else None) or revision,  # type: ignore[arg-type]
        python=settings.sglang_python or sys.executable,
        **opts,  # type: ignore[arg-type]
    )


@click.command("worker-sglang")
@click.option(
    "--model",
    required=True,
    help="Local path of the model, or its Hugging Face id once downloaded to the Hub cache.",
)
@click.option("--gpu", type=int, default=0, show_default=True, help="CUDA device index.")
@click.option("--host", default=None, help="Bind address [default: settings bind_host].")
@click.option("--port", type=int, default=None, help="HTTP port [default: settings worker_port].")
@click.option("--served-model-name", default=None, help="Model id clients use.")
@click.option("--page-size", type=int, default=64, show_default=True, help="Tokens per KV page.")
@click.option(
    "--hicache-size",
    "hicache_size_gb",
    type=int,
    default=0,
    help="Host KV pool in GB (overrides the ratio).",
)
@click.option(
    "--hicache-ratio",
    type=float,
    default=4.0,
    show_default=True,
    help="Host KV pool / GPU KV pool.",
)
@click.option(
    "--write-policy",
    "hicache_write_policy",
    type=click.Choice(WRITE_POLICIES),
    default="write_through",
    show_default=True,
)
@click.option(
    "--mem-fraction-static",
    type=float,
    default=0.85,
    show_default=True,
    help="GPU memory share for weights + KV.",
)
@click.option("--context-length", type=int, default=None)
@click.option("--max-running-requests", type=int, default=None)
@click.option("--kv-cache-dtype", default="auto", show_default=True)
@click.option("--capacity", type=int, default=None, help="Requests the gateway may send at once.")
@click.option("--worker-id", default=None, help="Registry id [default: HOSTNAME-gpuN].")
@click.option(
    "--advertise-url", default=None, help="URL gateways call [default: http://HOST:PORT]."
)
@click.option("--dry-run", is_flag=True, help="Print the SGLang command and exit.")
@click.argument("extra_args", nargs=-1, type=click.UNPROCESSED)
def worker_sglang(
    model: str,
    host: str | None,
    port: int | None,
    capacity: int | None,
    worker_id: str | None,
    advertise_url: str | None,
    dry_run: bool,
    extra_args: tuple[str, ...],
    **opts: object,
) -> None:
    """Serve MODEL with SGLang on one GPU, KV spilling to our NAS and object store.

    KV pages are keyed by the content of the weights, so they are hashed before SGLang
    starts (once per file version): MODEL is a local path, or a Hub id already in the
    Hugging Face cache, whose commit the launch pins. Arguments after `--` go to SGLang
    unchanged, but for a `--revision`, replaced by the commit it names in the cache.
    """
    settings = load_settings()
    revision, extra_args = split_revision(extra_args)
    weights = None
    try:
        if not dry_run:  # hashing the weights is no dry run: it shows DRY_RUN_WEIGHTS instead
            weights = resolve_weights(
                model, settings.models_dir / "fingerprints", revision=revision
            )
        spec = launch_spec(
            settings,
            model,
            weights,
            host=host or settings.bind_host,
            port=port or settings.worker_port,
            extra_args=extra_args,
            revision=revision,
            **opts,
        )
    except WeightsUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    if dry_run:
        click.echo(format_command(spec))
        return
    sys.exit(_serve(settings, spec, capacity, worker_id, advertise_url))


def _serve(
    settings: Settings,
    spec: SGLangLaunchSpec,
    capacity: int | None,
    worker_id: str | None,
    advertise_url: str | None,
) -> int:
    # Imported here so that --dry-run stays free of the database and HTTP machinery.
    from kvgate.wiring.database import settings_database
    from workers.agent import AgentConfig
    from workers.sglang.launcher import EngineProcessSpec, serve_with_agent

    with settings_database(settings) as dsn:
        secrets = {
            DATABASE_URL_ENV: dsn,
            S3_ACCESS_KEY_ENV: settings.s3_access_key.get_secret_value(),
            S3_SECRET_KEY_ENV: settings.s3_secret_key.get_secret_value(),
        }
        engine = EngineProcessSpec(
            argv=build_argv(spec), env=build_env(spec, secrets), health_url=f"{spec.url}/health"
        )
        agent = AgentConfig(
            worker_id=worker_id or f"{socket.gethostname()}-gpu{spec.gpu}",
            engine_url=spec.url,
            advertise_url=advertise_url,
            model=spec.backend.model,
            capacity=capacity or spec.max_running_requests or DEFAULT_CAPACITY,
        )
        click.echo(f"starting SGLang: {format_command(spec)}")
        return asyncio.run(serve_with_agent(engine, agent, dsn))
