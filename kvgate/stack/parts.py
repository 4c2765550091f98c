"""The parts of ``kvgate up`` and the explicit list that orders them.

Infrastructure comes first (Postgres, its migrations, the S3 server, the NAS directory);
the services that use it (tierd, worker, gateway, and the billing reporter when Stripe
is configured) follow, one line each. Each part hands the next ones what they need
through environment variables, the same ones a production deployment sets by hand:
``DATABASE_URL``, ``KVGATE_S3_*``, ``KVGATE_NAS_PATH``.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import asyncpg
import psutil

from kvgate.models.registry import served_model_id
from kvgate.settings import Settings, mask_url_password
from kvgate.stack.postgres import embedded_postgres
from kvgate.stack.process import (
    LateProcessPart,
    Probe,
    ProcessPart,
    http_probe,
    kvgate_argv,
    log_line_probe,
)
from kvgate.stack.prometheus import PrometheusPart
from kvgate.stack.seaweed import S3Endpoint, ensure_bucket, ping_s3, weed_command, weed_env
from kvgate.stack.supervisor import Part, PartError, Ready
from migrations import runner

#: minutes between two metered-usage reports of ``kvgate up`` (an hour, or the part of one
#: before a billing period's bound, closes ten minutes after it ends, so usage reaches
#: Stripe within 25 minutes of that: inside the hour Stripe waits to finalize an invoice)
BILLING_REPORT_EVERY_MIN = 15


def stack_parts(settings: Settings, *, monitoring: bool = False) -> list[Part]:
    """Everything ``kvgate up`` runs, in start order (stopped in reverse); with
    ``monitoring``, a Prometheus scraping the services last."""
    home = settings.home.absolute()
    url = settings.database_url.get_secret_value() if settings.database_url else None
    return [
        PostgresPart(url, home / "pg"),
        MigrationsPart(),
        s3_part(settings),
        NasPart(settings.nas_dir.absolute()),
        # --- services: one line each ------------------------------------------------------
        # The worker comes before the gateway so that the gateway stops taking requests
        # before the worker drains.
        logging_service(settings, "tierd", kvgate_argv("tierd"), r"^tierd: .*$"),
        http_service(
            settings, "worker", registered_worker_argv(settings), settings.worker_port, "/health"
        ),
        http_service(settings, "gateway", kvgate_argv("gateway"), settings.gateway_port, "/readyz"),
        *billing_parts(settings),
        *([PrometheusPart(settings)] if monitoring else []),
    ]


def billing_parts(settings: Settings) -> list[Part]:
    """The metered-usage reporter, when Stripe is configured (without a key there is
    nothing to report to): ``kvgate billing report`` every :data:`BILLING_REPORT_EVERY_MIN`
    minutes, which also ends lapsed grace periods."""
    if not settings.stripe_secret_key.get_secret_value():
        return []
    argv = kvgate_argv("billing", "report", f"--every={BILLING_REPORT_EVERY_MIN:g}")
    return [logging_service(settings, "billing", argv, r"^billing: .*$")]


def registered_worker_argv(settings: Settings) -> list[str]:
    """``kvgate worker`` under ``kvgate agent``, which keeps it in the worker registry
    (where the gateway finds it) and, on SIGTERM, deregisters and lets in-flight requests
    finish before it stops the worker."""
    url = f"http://{settings.bind_host}:{settings.worker_port}"
    return kvgate_argv(
        "agent",
        f"--url={url}",
        f"--model={served_model_id(settings.worker_model)}",
        f"--capacity={settings.worker_max_batch}",
        "--",
        *kvgate_argv("worker"),
    )


def http_service(
    settings: Settings, name: str, argv: Sequence[str], port: int, health_path: str
) -> ProcessPart:
    """A child serving HTTP on ``settings.bind_host:port``, ready when ``health_path`` answers 2xx."""
    base = f"http://{settings.bind_host}:{port}"
    return _service(settings, name, argv, lambda _log: http_probe(base + health_path, Ready(base)))


def logging_service(
    settings: Settings, name: str, argv: Sequence[str], ready_line: str
) -> ProcessPart:
    """A child without HTTP, ready once it logs a line matching ``ready_line`` (a regex)."""
    return _service(settings, name, argv, lambda log: log_line_probe(log, ready_line))


def _service(
    settings: Settings, name: str, argv: Sequence[str], make_probe: Callable[[Path], Probe]
) -> ProcessPart:
    """A child logging to ``$KVGATE_HOME/logs/<name>.log``, with ``KVGATE_HOME`` (absolute)
    in its environment besides the exports of the parts before it."""
    home = settings.home.absolute()
    log_path = home / "logs" / f"{name}.log"
    return ProcessPart(
        name,
        argv,
        probe=make_probe(log_path),
        log_path=log_path,
        env={"KVGATE_HOME": str(home)},
        stop_timeout=settings.stop_timeout,
    )


class PostgresPart:
    """``DATABASE_URL`` when given (only probed), else the embedded PostgreSQL in ``pg_dir``."""

    name = "postgres"

    def __init__(self, url: str | None, pg_dir: Path) -> None:
        self._url = url
        self._pg_dir = pg_dir
        self._dsn: str | None = None
        self._owned = contextlib.ExitStack()

    def start(self, env: Mapping[str, str]) -> None:
        """Start (or attach to) the embedded server; nothing to start for an external one."""
        self._dsn = self._url or self._owned.enter_context(embedded_postgres(self._pg_dir))

    def probe(self) -> Ready | None:
        """Ready once a connection runs ``SELECT 1``."""
        assert self._dsn is not None
        asyncio.run(_select_one(self._dsn))
        return Ready(mask_url_password(self._dsn), {"DATABASE_URL": self._dsn})

    def failure(self) -> str | None:
        """The embedded postmaster must stay alive; an external server is not ours to watch."""
        if self._url is not None:
            return None
        pid_file = self._pg_dir / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if pid is None or not psutil.pid_exists(pid):
            return f"the embedded PostgreSQL stopped; see {self._pg_dir / 'log'}"
        return None

    def stop(self) -> None:
        """Stop the embedded postmaster (``pgserver`` keeps it while other processes use it)."""
        self._owned.close()


async def _select_one(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


class MigrationsPart:
    """Applies pending migrations on the ``DATABASE_URL`` exported by the postgres part."""

    name = "migrations"

    def __init__(self, directory: Path = runner.MIGRATIONS_DIR) -> None:
        self._directory = directory
        self._summary = ""

    def start(self, env: Mapping[str, str]) -> None:
        """Run the migrations to completion (several stacks at once are safe: advisory lock)."""
        dsn = env.get("DATABASE_URL")
        if dsn is None:
            raise PartError("needs DATABASE_URL: the postgres part must come before it")
        try:
            applied = asyncio.run(self._migrate(dsn))
        except runner.MigrationError as exc:
            raise PartError(str(exc)) from exc
        total = len(runner.discover(self._directory))
        self._summary = f"{total} applied ({len(applied)} just now)"

    async def _migrate(self, dsn: str) -> list[str]:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            return await runner.migrate(conn, self._directory)
        finally:
            await conn.close()

    def probe(self) -> Ready | None:
        """Ready as soon as ``start`` returned."""
        return Ready(self._summary)

    def failure(self) -> str | None:
        """Nothing keeps running."""
        return None

    def stop(self) -> None:
        """Nothing to stop."""


def s3_part(settings: Settings) -> Part:
    """The configured S3 endpoint when ``s3_endpoint`` is set, else a local SeaweedFS."""
    if settings.s3_endpoint:
        endpoint = S3Endpoint(
            settings.s3_endpoint,
            settings.s3_access_key.get_secret_value(),
            settings.s3_secret_key.get_secret_value(),
            settings.s3_region,
        )
        return ExternalS3Part(endpoint, settings.s3_bucket)
    return SeaweedPart(settings)


def _s3_ready(endpoint: S3Endpoint, bucket: str) -> Ready:
    """Answering and holding ``bucket`` (created when missing); exports the S3 settings."""
    ping_s3(endpoint)
    ensure_bucket(endpoint, bucket)
    exports = {
        "KVGATE_S3_ENDPOINT": endpoint.url,
        "KVGATE_S3_ACCESS_KEY": endpoint.access_key,
        "KVGATE_S3_SECRET_KEY": endpoint.secret_key,
        "KVGATE_S3_REGION": endpoint.region,
        "KVGATE_S3_BUCKET": bucket,
    }
    return Ready(f"{endpoint.url} bucket={bucket}", exports)


class ExternalS3Part:
    """An S3 server someone else runs: probed until it answers, the bucket created if missing."""

    name = "s3"

    def __init__(self, endpoint: S3Endpoint, bucket: str) -> None:
        self._endpoint = endpoint
        self._bucket = bucket

    def start(self, env: Mapping[str, str]) -> None:
        """Nothing to start."""

    def probe(self) -> Ready | None:
        """Ready once ListBuckets answers and the bucket exists."""
        return _s3_ready(self._endpoint, self._bucket)

    def failure(self) -> str | None:
        """Not ours to watch."""
        return None

    def stop(self) -> None:
        """Nothing to stop."""


class SeaweedPart(LateProcessPart):
    """SeaweedFS (``weed server -s3``) on free loopback ports, data in ``$KVGATE_HOME/s3``."""

    name = "s3"

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._settings = settings

    def process(self, env: Mapping[str, str]) -> ProcessPart:
        """Pick free ports now (not earlier, so that nothing takes them meanwhile)."""
        s = self._settings
        argv, endpoint = weed_command(
            s.s3_dir.absolute(),
            access_key=s.s3_access_key.get_secret_value(),
            secret_key=s.s3_secret_key.get_secret_value(),
            # the services start after SeaweedFS: its ports must not be theirs
            avoid=(s.gateway_port, s.worker_port, s.tierd_metrics_port, s.prometheus_port),
        )
        endpoint = S3Endpoint(endpoint.url, endpoint.access_key, endpoint.secret_key, s.s3_region)
        return ProcessPart(
            self.name,
            argv,
            probe=lambda: _s3_ready(endpoint, s.s3_bucket),
            env=weed_env(s.s3_dir),
            log_path=s.home.absolute() / "logs" / "s3.log",
            stop_timeout=s.stop_timeout,
        )


class NasPart:
    """The NAS directory: created when missing, and checked to be a writable directory."""

    name = "nas"

    def __init__(self, path: Path) -> None:
        self._path = path

    def start(self, env: Mapping[str, str]) -> None:
        """Create the directory and write (then delete) a probe file in it."""
        try:
            self._path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise PartError(
                f"{self._path} is not a directory ({exc.strerror}); "
                "point KVGATE_NAS_PATH at a directory"
            ) from exc
        except OSError as exc:
            raise PartError(f"cannot create {self._path}: {exc.strerror}") from exc
        try:
            with tempfile.NamedTemporaryFile(dir=self._path, prefix=".kvgate-probe-"):
                pass
        except OSError as exc:
            raise PartError(f"{self._path} is not writable: {exc.strerror}") from exc

    def probe(self) -> Ready | None:
        """Ready as soon as ``start`` returned."""
        return Ready(str(self._path), {"KVGATE_NAS_PATH": str(self._path)})

    def failure(self) -> str | None:
        """A directory that vanished while running is a failure."""
        return None if self._path.is_dir() else f"{self._path} disappeared"

    def stop(self) -> None:
        """Nothing to stop; the directory and its contents stay."""
