"""``kvgate config``: print the effective settings with secrets masked."""

from __future__ import annotations

import json

import click

from kvgate.settings import load_settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
def config(as_json: bool) -> None:
    """Print the effective settings (environment, kvgate.toml, defaults); secrets are masked."""
    values = load_settings().masked()
    if as_json:
        click.echo(json.dumps(values, indent=2, sort_keys=True))
        return
    width = max(map(len, values))
    for key, value in values.items():
        click.echo(f"{key:<{width}}  {'' if value is None else value}")
