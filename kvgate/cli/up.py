"""``kvgate up``: run the whole single-machine stack in the foreground."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import click

from kvgate.settings import load_settings
from kvgate.stack.parts import stack_parts
from kvgate.stack.supervisor import Stack, run


@click.command()
@click.option(
    "--monitoring",
    is_flag=True,
    help="Also run Prometheus (Debian's `prometheus` package) scraping the stack, with "
    "kvgate's alert rules loaded; its address is printed on its ready line.",
)
def up(monitoring: bool) -> None:
    """Run the single-machine stack in the foreground until Ctrl-C or SIGTERM.

    \b
    Parts, started in this order and stopped in reverse:
      postgres    DATABASE_URL if set (only probed), else an embedded PostgreSQL
                  with its data in $KVGATE_HOME/pg (kept across restarts)
      migrations  applies pending migrations/NNNN_*.sql (see `kvgate migrate`)
      s3          KVGATE_S3_ENDPOINT if set (only probed), else SeaweedFS on free
                  local ports with its data in $KVGATE_HOME/s3; creates the bucket
                  KVGATE_S3_BUCKET either way
      nas         creates KVGATE_NAS_PATH (default $KVGATE_HOME/nas), checks it is
                  a writable directory
      tierd       `kvgate tierd`: keeps the NAS and the object store within their
                  limits, metrics on KVGATE_TIERD_METRICS_PORT; ready when it logs its
                  `tierd: ...` line
      worker      `kvgate worker` (built-in engine, KVGATE_WORKER_MODEL, default
                  SmolLM2-135M-Instruct fetched once) on KVGATE_WORKER_PORT, run by
                  `kvgate agent`, which enters it in the worker registry (so the
                  gateway routes to it) and drains it on stop; ready when GET /health
                  answers
      gateway     `kvgate gateway` on KVGATE_BIND_HOST:KVGATE_GATEWAY_PORT (OpenAI API
                  under /v1), ready when GET /readyz answers
      billing     only when KVGATE_STRIPE_SECRET_KEY is set: `kvgate billing report
                  --every 15` sends metered usage to Stripe; ready at its first line
      prometheus  only with --monitoring: Prometheus on KVGATE_PROMETHEUS_PORT,
                  scraping the gateway, the worker and tierd every 5 s, with the
                  alerts of infra/prometheus/kvgate-rules.yml; data in
                  $KVGATE_HOME/prometheus (the dashboard: infra/grafana/kvgate.json)

    \b
    Each part is waited for by probing it (a query, an S3 call, an HTTP health check,
    a line in its log) for at most KVGATE_READY_TIMEOUT seconds, then one line is printed:
      ready  <part>  <address>
    Child processes log to $KVGATE_HOME/logs/<part>.log and receive DATABASE_URL,
    KVGATE_S3_ENDPOINT, KVGATE_S3_ACCESS_KEY, KVGATE_S3_SECRET_KEY, KVGATE_S3_REGION,
    KVGATE_S3_BUCKET, KVGATE_NAS_PATH and KVGATE_HOME from the parts before them.

    \b
    Ctrl-C or SIGTERM stops every part it started, newest first: SIGTERM, then
    SIGKILL (descendants too) after KVGATE_STOP_TIMEOUT seconds. SeaweedFS alone
    would take ~25s to finish a graceful shutdown; it is killed at the timeout (its
    data files are written through). The embedded PostgreSQL is stopped with
    `pg_ctl stop` unless another kvgate process still uses it.
    Exit status: 0 after a requested stop; 1 when a part failed to start or died,
    with a message naming the part and the cause.
    Only one `kvgate up` may run per KVGATE_HOME (it holds $KVGATE_HOME/up.lock).
    `kvgate config` shows the settings in effect.
    """
    settings = load_settings()
    with _one_stack_per_home(settings.home.absolute()):
        parts = stack_parts(settings, monitoring=monitoring)
        stack = Stack(parts, ready_timeout=settings.ready_timeout, echo=_out)
        code = run(stack, echo=_out, echo_err=_err)
    raise SystemExit(code)


@contextlib.contextmanager
def _one_stack_per_home(home: Path) -> Iterator[None]:
    """Hold ``$KVGATE_HOME/up.lock`` while the stack runs.

    Two stacks on one home would run two SeaweedFS servers on one data directory. The
    kernel drops the lock when this process exits, however it exits, and children do not
    inherit it.
    """
    home.mkdir(parents=True, exist_ok=True)
    lock_path = home / "up.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise click.ClickException(
                f"another `kvgate up` (pid {holder}) is running on {home}; stop it first, "
                "or set KVGATE_HOME to another directory"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def _out(line: str) -> None:
    click.echo(line)


def _err(line: str) -> None:
    click.echo(line, err=True)
