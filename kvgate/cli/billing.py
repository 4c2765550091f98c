"""``kvgate billing``: send metered usage to Stripe, and check Stripe against our totals.

``report`` runs periodically (``--every``, as ``kvgate up`` does, or from cron or the
Kubernetes CronJob in ``infra/``): it sends the usage of every closed interval (a UTC hour,
cut where a billing period starts or ends) not yet acknowledged, under stable identifiers so
overlapping or repeated runs never bill twice, and ends grace periods that ran out. Run it at
least every 15 minutes: Stripe finalizes a period's invoice about an hour after the period
ends, and usage reported later is not billed. ``reconcile`` reads Stripe's meter summaries
back and lists every hour in which they differ from ours.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import click
import stripe

from gateway.billing import meters, subscriptions
from gateway.billing.client import BillingDisabled, stripe_client
from gateway.billing.reconcile import Reconciliation, reconcile
from kvgate.settings import load_settings
from kvgate.wiring.accounts import billing_config
from kvgate.wiring.database import run_on_database

T = TypeVar("T")
#: How reconcile prints a time (always UTC).
_AT = "%Y-%m-%d %H:%M"


def _run(
    ctx: click.Context, work: Callable[[asyncpg.Connection, stripe.StripeClient], Awaitable[T]]
) -> T:
    """Run ``work`` with a connection to the configured database and a Stripe client.

    ``ctx.obj["stripe_http_client"]`` replaces stripe-python's transport (tests put a
    recording stub there); normally it is absent.
    """
    settings = load_settings()
    config = billing_config(settings)
    http_client = (ctx.obj or {}).get("stripe_http_client")
    try:
        return run_on_database(
            settings, lambda conn: work(conn, stripe_client(config, http_client))
        )
    except BillingDisabled as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def billing() -> None:
    """Stripe metered usage: report it, reconcile it."""


@billing.command("report")
@click.option(
    "--every",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="MINUTES",
    help="Keep running: report again every MINUTES (a failed round is retried by the next); "
    "15 or less, so usage before a renewal or cancellation reaches Stripe within the hour "
    "before it finalizes that invoice. Without it, report once and exit.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=None,
    help="With --every: stop after this many rounds (default: run until stopped).",
)
@click.pass_context
def report_cmd(ctx: click.Context, every: float | None, rounds: int | None) -> None:
    """Send token usage to Stripe Billing Meters by the hour; end expired grace periods.

    Each UTC hour (split where a billing period starts or ends) is sent by the first round
    from ten minutes after it ends, as one event per meter stamped inside it, so Stripe
    bills it on the invoice of the period it was used in. Exits non-zero when the last
    round left usage unsent; each event carries a stable identifier, so a later round
    resends it without ever billing it twice.
    """
    if every is None:
        if rounds is not None:
            raise click.UsageError("--rounds counts the rounds of --every; give --every too")
        if not _report_round(ctx):
            raise click.ClickException("some usage was not reported; run again to retry it")
        return
    click.echo(f"billing: reporting every {every:g} minutes")
    done = 0
    while True:
        try:
            sent_all = _report_round(ctx)
        except click.ClickException:
            raise  # a setting to fix (Stripe not configured): no later round can do better
        except Exception as exc:  # the database, the network, a bug: the next round retries
            click.echo(f"billing: this round failed, the next retries it: {exc!r}", err=True)
            sent_all = False
        done += 1
        if rounds is not None and done >= rounds:
            break
        time.sleep(every * 60)
    if not sent_all:
        raise click.ClickException("the last round left usage unsent; the next run retries it")


def _report_round(ctx: click.Context) -> bool:
    """One report; True when nothing was left unsent."""

    async def work(conn: asyncpg.Connection, client: stripe.StripeClient) -> Any:
        result = await meters.report(conn, client, datetime.now(UTC))
        lapsed = await subscriptions.expire_grace(conn)
        return result, lapsed

    result, lapsed = _run(ctx, work)
    click.echo(
        f"sent {len(result.sent)} meter events, {result.already} already reported, "
        f"{len(result.failed)} failed; {len(lapsed)} teams dropped to free after grace"
    )
    for identifier, error in result.failed.items():
        click.echo(f"  not sent: {identifier}: {error}", err=True)
    return not result.failed


@billing.command("reconcile")
@click.option(
    "--days",
    default=meters.MAX_AGE_DAYS,
    show_default=True,
    help="UTC days to check, up to the last closed hour.",
)
@click.pass_context
def reconcile_cmd(ctx: click.Context, days: int) -> None:
    """Compare local usage with Stripe's meters hour by hour; list every difference.

    An hour's local total (usage on a paid subscription, by when it was used) must equal
    Stripe's (events by their timestamp), or Stripe bills it in the wrong period or not at
    all. Days reported whole before reporting went hourly are compared as whole days.
    """
    config = billing_config(load_settings())

    async def work(conn: asyncpg.Connection, client: stripe.StripeClient) -> Reconciliation:
        return await reconcile(conn, client, config, datetime.now(UTC), days)

    outcome = _run(ctx, work)
    click.echo(
        f"compared {outcome.compared} (team, meter, hour) totals from {outcome.since:{_AT}} to "
        f"{outcome.until:{_AT}} UTC: {len(outcome.differences)} differences"
    )
    if outcome.differences:
        click.echo("team\tcustomer\tmeter\tfrom\tto\tlocal\tstripe\tdifference")
        for d in outcome.differences:
            click.echo(
                f"{d.team_id}\t{d.customer_id}\t{d.meter}\t{d.start:{_AT}}\t{d.end:{_AT}}\t"
                f"{d.local}\t{d.stripe}\t{d.local - d.stripe:+d}"
            )
        raise SystemExit(1)
