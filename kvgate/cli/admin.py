"""``kvgate admin``: manage teams, API keys and sign-in users from the command line.

Operators use it where the web console cannot help: before anyone can sign in (the first
staff user, ``users create --staff``) and for scripted onboarding. A key's secret is
printed exactly once, by ``keys create``: only its hash is stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import click

from gateway import accounts
from gateway.admin import staff as staff_users
from kvgate.settings import load_settings
from kvgate.wiring.database import run_on_database

T = TypeVar("T")


def _with_db(work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run ``work`` on the configured (migrated) database; account errors become CLI errors."""
    try:
        return run_on_database(load_settings(), work)
    except (accounts.AccountError, staff_users.StaffError) as exc:
        raise click.ClickException(str(exc)) from exc


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


@click.group()
def admin() -> None:
    """Teams, API keys and sign-in users."""


@admin.group()
def teams() -> None:
    """Create and list teams."""


@teams.command("create")
@click.argument("name")
@click.option("--plan", default="team", show_default=True, help="Plan name (plans table).")
def teams_create(name: str, plan: str) -> None:
    """Create team NAME on PLAN."""
    team = _with_db(lambda db: accounts.create_team(db, name, plan))
    click.echo(f"created team {team.name} (id {team.id}, plan {team.plan})")


@teams.command("list")
def teams_list() -> None:
    """List every team."""
    for team in _with_db(accounts.list_teams):
        click.echo(f"{team.id}\t{team.name}\t{team.plan}\t{_when(team.created_at)}")


@admin.group()
def keys() -> None:
    """Create, list and revoke API keys."""


@keys.command("create")
@click.option("--team", required=True, help="Team that owns the key.")
@click.option("--name", default="", help="A label for the key (e.g. where it is used).")
def keys_create(team: str, name: str) -> None:
    """Create a key for TEAM and print its secret (shown only this once)."""
    info, secret = _with_db(lambda db: accounts.create_key(db, team, name))
    click.echo(f"created key {info.id} ({info.prefix}…) for team {info.team}", err=True)
    click.echo("store the secret now; it cannot be shown again:", err=True)
    click.echo(secret)


@keys.command("list")
@click.option("--team", default=None, help="Only this team's keys.")
def keys_list(team: str | None) -> None:
    """List keys (prefix only, never the secret)."""
    for k in _with_db(lambda db: accounts.list_keys(db, team)):
        state = f"revoked {_when(k.revoked_at)}" if k.revoked_at else "active"
        click.echo(f"{k.id}\t{k.prefix}…\t{k.team}\t{k.name}\t{_when(k.created_at)}\t{state}")


@keys.command("revoke")
@click.argument("key_id", type=int)
def keys_revoke(key_id: int) -> None:
    """Revoke key KEY_ID; every gateway replica refuses it within a few seconds."""
    info = _with_db(lambda db: accounts.revoke_key(db, key_id))
    click.echo(f"revoked key {info.id} ({info.prefix}…) of team {info.team}")


@admin.group()
def users() -> None:
    """Create sign-in users (staff for the /admin dashboard)."""


@users.command("create")
@click.argument("email")
@click.option("--staff", is_flag=True, help="May use /admin (leads, teams, workers, audit).")
@click.password_option(help="Sign-in password (prompted when not given).")
def users_create(email: str, staff: bool, password: str) -> None:
    """Create a verified user EMAIL (or make an existing one staff with --staff)."""
    user_id, created = _with_db(
        lambda db: staff_users.create_user(db, email, password, staff=staff)
    )
    what = "created" if created else "kept existing"
    click.echo(f"{what} user {email} (id {user_id}){' as staff' if staff else ''}")
