"""The ``kvgate`` command line.

Subcommands live in their own modules and are imported only when invoked, so that
``kvgate --help`` and the torch-free commands (gateway, migrate, config) start fast. The
table below is the complete list: adding a command means adding one line to it.
"""

from __future__ import annotations

import importlib

import click

#: subcommand name -> "module:attribute" of its click command or group
COMMANDS: dict[str, str] = {
    "config": "kvgate.cli.config:config",
    "migrate": "kvgate.cli.migrate:migrate",
    "tierd": "kvgate.cli.tierd:tierd",
    "worker-sglang": "kvgate.cli.worker_sglang:worker_sglang",
    "agent": "kvgate.cli.agent:agent",
    "models": "kvgate.cli.models:models_group",
    "bench": "kvgate.cli.bench:bench",
    "worker": "kvgate.cli.worker:worker",
    "up": "kvgate.cli.up:up",
    "admin": "kvgate.cli.admin:admin",
    "gateway": "kvgate.cli.gateway:gateway",
    "billing": "kvgate.cli.billing:billing",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    #: this group's subcommand table; a nested group (e.g. `kvgate bench`) sets its own
    table: dict[str, str] = COMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.table)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.table.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvgate")
def cli() -> None:
    """kvgate: LLM serving whose KV cache spills VRAM -> host RAM -> NAS -> S3 and comes back.

    Settings come from KVGATE_* environment variables (and DATABASE_URL, AWS_*) and an
    optional kvgate.toml; `kvgate config` shows the effective values.
    """


def main() -> None:
    """Console-script entry point."""
    cli()
