"""The processes a ``kvgate bench multiturn --compare`` run starts on this machine.

One embedded Postgres and one SeaweedFS serve the whole run; every configuration gets a
database, a NAS directory and an S3 prefix of its own, so no configuration ever finds
pages another one wrote. Workers (:mod:`kvgate.bench.multiturn.worker`), tierd, the gateway and
the worker agents are child processes (:class:`~kvgate.stack.process.ProcessPart`) that
are probed until ready and stopped with SIGTERM when their block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import asyncpg

from gateway import accounts
from kvgate.stack.ports import free_port
from kvgate.stack.postgres import embedded_postgres
from kvgate.stack.seaweed import S3Endpoint, seaweed_s3
from kvgate.stack.supervisor import PartError, Ready

__all__ = ["PartError"]  # raised by every start here; callers catch it from this module
from kvgate.stack.process import ProcessPart, http_probe, kvgate_argv
from migrations import runner

#: Seconds a worker may take to load its model and answer /health.
READY_TIMEOUT_S = 300.0
BUCKET = "kvbench"


@dataclass(frozen=True)
class Services:
    """Where the shared services of a run live."""

    dsn: str
    #: None when the run uses no object store
    s3: S3Endpoint | None
    root: Path


@contextlib.contextmanager
def services(root: Path, *, with_s3: bool = True) -> Iterator[Services]:
    """Postgres, and SeaweedFS when ``with_s3``, under ``root`` for the length of the block."""
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(embedded_postgres(root / "pg"))
        endpoint = None
        if with_s3:
            endpoint, _ = stack.enter_context(seaweed_s3(root / "s3", bucket=BUCKET))
        yield Services(dsn, endpoint, root)


@dataclass(frozen=True)
class Site:
    """One configuration's private share of the services: database, NAS, S3 prefix."""

    dsn: str
    nas: Path
    s3_prefix: str
    env: dict[str, str]


def new_site(svc: Services, name: str, **settings: object) -> Site:
    """A fresh migrated database, NAS directory and S3 prefix; ``settings`` become env vars
    (``tier_host_bytes=...`` is ``KVGATE_TIER_HOST_BYTES``)."""
    tag = f"{name}_{uuid.uuid4().hex[:8]}"
    dsn = asyncio.run(_fresh_database(svc.dsn, tag))
    nas = svc.root / "nas" / tag
    nas.mkdir(parents=True)
    env = {"DATABASE_URL": dsn, "KVGATE_NAS_PATH": str(nas)}
    if svc.s3 is not None:
        env |= {
            "KVGATE_S3_ENDPOINT": svc.s3.url,
            "KVGATE_S3_ACCESS_KEY": svc.s3.access_key,
            "KVGATE_S3_SECRET_KEY": svc.s3.secret_key,
            "KVGATE_S3_REGION": svc.s3.region,
            "KVGATE_S3_BUCKET": BUCKET,
            "KVGATE_S3_PREFIX": f"{tag}/",
        }
    env |= {f"KVGATE_{k.upper()}": str(v) for k, v in settings.items()}
    return Site(dsn, nas, f"{tag}/", env)


def snapshot(svc: Services, site: Site, name: str) -> Site:
    """A fresh site that starts where ``site`` is: its ledger rows copied into a new
    database, its NAS files hard-linked into a new directory (pages are written to a
    temporary name and renamed, never changed in place, so the two never disturb each
    other), a new S3 prefix, and ``site``'s other settings. A configuration played on it
    finds the pages another primed, and writes none that a third would find."""
    fresh = new_site(svc, name)
    shutil.rmtree(fresh.nas)
    shutil.copytree(site.nas, fresh.nas, copy_function=os.link)
    asyncio.run(_copy_ledger(site.dsn, fresh.dsn))
    own = ("DATABASE_URL", "KVGATE_NAS_PATH", "KVGATE_S3_PREFIX")
    env = {k: v for k, v in site.env.items() if k not in own} | {
        k: v for k, v in fresh.env.items() if k in own
    }
    return replace(fresh, env=env)


async def _copy_ledger(source: str, target: str) -> None:
    buffer = io.BytesIO()
    conn = await asyncpg.connect(source)
    try:
        await conn.copy_from_table("kv_ledger", output=buffer, format="binary")
    finally:
        await conn.close()
    buffer.seek(0)
    conn = await asyncpg.connect(target)
    try:
        await conn.copy_to_table("kv_ledger", source=buffer, format="binary")
    finally:
        await conn.close()


async def _fresh_database(server_dsn: str, name: str) -> str:
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(server_dsn, database=name)
    try:
        await runner.migrate(conn)
    finally:
        await conn.close()
    base, _, query = server_dsn.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


def start_process(
    name: str, argv: list[str], probe_url: str, log_dir: Path, env: dict[str, str]
) -> ProcessPart:
    """Start ``argv`` and return it once ``GET probe_url`` answers 2xx (stopped again if it
    never does: ``PartError``)."""
    return start_processes([(name, argv, probe_url)], log_dir, env)[0]


def start_processes(
    specs: list[tuple[str, list[str], str]], log_dir: Path, env: dict[str, str]
) -> list[ProcessPart]:
    """Start every ``(name, argv, probe_url)`` at once and return them once each probe
    answers 2xx: their start-ups (imports, model loading) overlap. All are stopped again if
    one never answers (``PartError``)."""
    parts = [
        ProcessPart(
            name,
            argv,
            probe=http_probe(url, Ready(url)),
            log_path=log_dir / f"{name}.log",
            env=env,
            stop_timeout=60.0,
        )
        for name, argv, url in specs
    ]
    started: list[ProcessPart] = []
    try:
        for part in parts:
            part.start({})
            started.append(part)
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(zip(parts, specs, strict=True))
        while waiting:
            waiting = [(part, spec) for part, spec in waiting if not _ready(part)]
            if waiting and time.monotonic() > deadline:
                name, _, url = waiting[0][1]
                raise PartError(f"{name} did not answer {url} in {READY_TIMEOUT_S:.0f} s")
            if waiting:
                time.sleep(0.1)  # the poll period; readiness is what the loop checks
        return parts
    except BaseException:
        for part in started:
            part.stop()
        raise


def _ready(part: ProcessPart) -> bool:
    """Whether ``part`` answers its probe; ``PartError`` when it has died."""
    try:
        return part.probe() is not None
    except PartError:
        raise
    except Exception:  # not listening yet
        return False


@contextlib.contextmanager
def process(
    name: str, argv: list[str], probe_url: str, log_dir: Path, env: dict[str, str]
) -> Iterator[str]:
    """Run ``argv`` until the block ends; yields once ``GET probe_url`` answers 2xx."""
    part = start_process(name, argv, probe_url, log_dir, env)
    try:
        yield probe_url.rsplit("/", 1)[0]
    finally:
        part.stop()


def worker_argv(tiers: str, port: int) -> list[str]:
    """The command line of a benchmark worker over ``tiers`` on ``port``."""
    return [
        sys.executable,
        "-m",
        "kvgate.bench.multiturn.worker",
        "--tiers",
        tiers,
        "--port",
        str(port),
    ]


@contextlib.contextmanager
def worker(name: str, tiers: str, site: Site, log_dir: Path) -> Iterator[str]:
    """A benchmark worker; yields its base URL."""
    port = free_port()
    with process(
        name, worker_argv(tiers, port), f"http://127.0.0.1:{port}/health", log_dir, site.env
    ) as url:
        yield url


@contextlib.contextmanager
def registered_workers(
    worker_ids: Sequence[str], tiers: str, model: str, site: Site, log_dir: Path
) -> Iterator[list[str]]:
    """Benchmark workers under ``kvgate agent`` (so gateways route to them), started at once;
    yields their URLs."""
    ports = [free_port() for _ in worker_ids]
    specs = [
        (wid, registered_worker_argv(wid, tiers, model, port), f"http://127.0.0.1:{port}/health")
        for wid, port in zip(worker_ids, ports, strict=True)
    ]
    parts = start_processes(specs, log_dir, site.env)
    try:
        yield [url.rsplit("/", 1)[0] for _, _, url in specs]
    finally:
        for part in parts:
            part.stop()


def registered_worker_argv(worker_id: str, tiers: str, model: str, port: int) -> list[str]:
    """The command line of a benchmark worker on ``port`` under ``kvgate agent``."""
    url = f"http://127.0.0.1:{port}"
    return kvgate_argv(
        "agent", "--url", url, "--model", model, "--worker-id", worker_id, "--capacity", "64",
        "--drain-quiet", "0.5", "--", *worker_argv(tiers, port),
    )  # fmt: skip


@contextlib.contextmanager
def tierd(site: Site, log_dir: Path) -> Iterator[None]:
    """``kvgate tierd`` on ``site`` (its limits come from ``site.env``)."""
    env = {**site.env, "KVGATE_TIERD_METRICS_PORT": "0"}  # several sites, no dashboards
    part = ProcessPart("tierd", kvgate_argv("tierd"), probe=lambda: None, log_path=log_dir / "tierd.log", env=env)  # fmt: skip
    part.start({})
    try:
        yield
    finally:
        part.stop()


@contextlib.contextmanager
def gateway(site: Site, log_dir: Path) -> Iterator[str]:
    """A gateway on ``site``'s database; yields its base URL."""
    port = free_port()
    env = {**site.env, "KVGATE_GATEWAY_PORT": str(port)}
    with process(
        "gateway", kvgate_argv("gateway"), f"http://127.0.0.1:{port}/healthz", log_dir, env
    ):
        yield f"http://127.0.0.1:{port}"


def api_key(site: Site, cache_salt: str = "") -> str:
    """A new team and key on ``site``'s database; returns the key's secret. With
    ``cache_salt`` the team's requests use that KV namespace (the one pages were primed in
    by requests sent to a worker directly)."""

    async def make() -> str:
        conn = await asyncpg.connect(site.dsn)
        try:
            team = await accounts.create_team(conn, f"bench-{uuid.uuid4().hex[:8]}")
            if cache_salt:
                await conn.execute(
                    "UPDATE teams SET cache_salt = $1 WHERE id = $2", cache_salt, team.id
                )
            return (await accounts.create_key(conn, team.name))[1]
        finally:
            await conn.close()

    return asyncio.run(make())


def ledger_pages(site: Site) -> tuple[int, int]:
    """Pages the ledger records on the NAS and in the object store."""

    async def count() -> tuple[int, int]:
        conn = await asyncpg.connect(site.dsn)
        try:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE tiers & 1 <> 0) AS nas,"
                " count(*) FILTER (WHERE tiers & 2 <> 0) AS obj FROM kv_ledger"
            )
            return int(row["nas"]), int(row["obj"])
        finally:
            await conn.close()

    return asyncio.run(count())
