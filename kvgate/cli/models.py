"""``kvgate models``: fetch, list and export the tokenizer of the models the worker serves."""

from __future__ import annotations

from pathlib import Path

import click

from kvgate.models import registry as models
from kvgate.settings import load_settings


@click.group("models")
def models_group() -> None:
    """Model files cached in $KVGATE_HOME/models."""


@models_group.command()
@click.argument("model_id", default=models.DEFAULT_MODEL)
@click.option(
    "--verify", is_flag=True, help="Re-hash a cached file instead of trusting the sidecar."
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def pull(model_id: str, verify: bool, quiet: bool) -> None:
    """Download MODEL_ID (default smollm2-135m-instruct) unless a verified copy is cached."""
    models_dir = load_settings().models_dir
    try:
        result = models.pull(models_dir, model_id, verify=verify, quiet=quiet)
    except models.ModelFetchError as exc:
        raise click.ClickException(str(exc)) from exc
    if result.fetched:
        why = "" if result.reason == "missing" else f" (cached copy was {result.reason})"
        click.echo(f"fetched {model_id} -> {result.path}{why}")
    else:
        click.echo(f"cached {model_id} -> {result.path} (verified)")


@models_group.command("list")
@click.option("--verify", is_flag=True, help="Re-hash every file instead of trusting the sidecar.")
def list_models(verify: bool) -> None:
    """Show the cached models: id, file, size and whether the checksum holds."""
    models_dir = load_settings().models_dir
    cached = models.cached_models(models_dir, verify=verify)
    if not cached:
        click.echo(f"no models in {models_dir}; run `kvgate models pull`")
        return
    click.echo(f"{'ID':<24} {'SIZE':>10}  {'VERIFIED':<8}  FILE")
    for m in cached:
        size = f"{m.size / 1e6:.1f} MB"
        click.echo(f"{m.id:<24} {size:>10}  {'yes' if m.verified else 'NO':<8}  {m.path}")


@models_group.command("export-tokenizer")
@click.argument("model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def export_tokenizer(model: str, directory: Path) -> None:
    """Write MODEL's tokenizer as Hugging Face files into DIRECTORY.

    MODEL is a registry id (pulled if needed), a .gguf file or a model directory. The files
    (tokenizer.json, tokenizer_config.json with the chat template, special_tokens_map.json)
    load with transformers.AutoTokenizer.from_pretrained(DIRECTORY).
    """
    from workers.engine.tokenizer import load_tokenizer

    if model in models.REGISTRY:
        source = models.ensure_model(load_settings().models_dir, model)
    elif Path(model).exists():
        source = Path(model)
    else:
        known = ", ".join(sorted(models.REGISTRY))
        raise click.BadParameter(
            f"{model!r} is neither a known model ({known}) nor an existing path", param_hint="MODEL"
        )
    try:
        written = load_tokenizer(source).save_pretrained(directory)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    for path in written:
        click.echo(f"wrote {path}")
