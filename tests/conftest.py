"""Session-wide real infrastructure for every test: Postgres, a SeaweedFS S3 server, a NAS dir.

Postgres is ``DATABASE_URL`` when set (CI may point at a server of its own), otherwise an
embedded PostgreSQL in a temporary directory; all migrations are applied once. The S3
server is a real ``weed server -s3`` on free loopback ports. Tests share these servers, so
each test uses its own names (namespaces, teams, bucket prefixes) rather than cleaning up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import httpx
import pytest

from kvgate.stack.postgres import create_pool, database
from kvgate.stack.seaweed import S3Endpoint, seaweed_s3
from migrations import runner

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from tests.support.stripe_stub import RecordingStripe
    from workers.engine.engine import TorchEngine


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a migrated Postgres shared by the whole session.

    The embedded server's data lives outside pytest's temp root on purpose: as root,
    pgserver runs PostgreSQL as its own user, and every new pytest session on the machine
    resets ``/tmp/pytest-of-root`` to mode 0700, which would lock that user out mid-run.
    """
    import asyncio

    data = Path(tempfile.mkdtemp(prefix="kvgate-test-pg-"))
    with database(os.environ.get("DATABASE_URL"), data) as dsn:

        async def _migrate() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await runner.migrate(conn)
            finally:
                await conn.close()

        asyncio.run(_migrate())
        yield dsn
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
async def pg_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """An asyncpg pool on the session database (session event loop)."""
    pool = await create_pool(pg_dsn, min_size=1, max_size=8)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """A real SeaweedFS S3 endpoint with the bucket ``kvtest`` created."""
    with seaweed_s3(tmp_path_factory.mktemp("s3"), bucket="kvtest") as (endpoint, _proc):
        yield endpoint


@pytest.fixture
def nas_dir(tmp_path: Path) -> Path:
    """A fresh directory standing in for the NAS mount."""
    path = tmp_path / "nas"
    path.mkdir()
    return path


#: Models downloaded by tests, kept across sessions (gitignored with the rest of .kvgate/).
TEST_MODELS_DIR = Path(__file__).resolve().parent.parent / ".kvgate" / "test-cache" / "models"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The verified SmolLM2-135M-Instruct GGUF, downloaded once into the persistent test cache."""
    from kvgate.models.registry import ensure_model

    return ensure_model(TEST_MODELS_DIR, "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def stripe_account() -> RecordingStripe:
    """The session's Stripe account: a recording stub with our meters. Reconcile checks
    every team with a Stripe customer in the shared database, so every test that reports
    usage from it reports to this one account."""
    from tests.support.billing import meter_account

    return meter_account()


@pytest.fixture(scope="module")
def worker_engine() -> Iterator[TorchEngine]:
    """The tiny random Llama engine (4 MiB of KV) behind :func:`worker_client`: one per test
    module, so that what one module leaves in its cache cannot move another's counts."""
    from tests.support.worker import tiny_engine

    engine = tiny_engine(kv_pool_bytes=4 * 2**20)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def worker_asgi_app(worker_engine: TorchEngine, smollm2_gguf: Path) -> Starlette:
    """The real worker app over :func:`worker_engine` (SmolLM2's tokenizer and template)."""
    from tests.support.worker import worker_app

    return worker_app(worker_engine, smollm2_gguf)


@pytest.fixture
async def worker_client(worker_asgi_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on :func:`worker_asgi_app`, served in-process."""
    transport = httpx.ASGITransport(worker_asgi_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
        yield c
