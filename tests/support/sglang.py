"""Building our SGLang storage backend the way SGLang does, for the tests/test_sglang_* files."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgate.bench.hicache_pool import MHAHostPoolReplica, attach
from kvgate.stack.seaweed import S3Endpoint
from tiering.sglang.options import (
    DATABASE_URL_ENV,
    S3_ACCESS_KEY_ENV,
    S3_SECRET_KEY_ENV,
    SGLangBackendOptions,
)

PAGE = 4  # tokens per page: small pages keep the tests fast, the code paths are the same


def weights(name: str) -> str:
    """A weights fingerprint (``sha256:…``) standing for the checkpoint ``name``."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


#: the weights every backend of these tests serves unless told otherwise
WEIGHTS = weights("test-model v1")


def backend_env(monkeypatch: pytest.MonkeyPatch, pg_dsn: str, s3: S3Endpoint) -> None:
    """The secrets the launcher puts in the SGLang process's environment."""
    monkeypatch.setenv(DATABASE_URL_ENV, pg_dsn)
    monkeypatch.setenv(S3_ACCESS_KEY_ENV, s3.access_key)
    monkeypatch.setenv(S3_SECRET_KEY_ENV, s3.secret_key)


def options(nas_dir: Path, s3: S3Endpoint, prefix: str, **kw: object) -> SGLangBackendOptions:
    """Backend options on the test NAS and S3 bucket ``kvtest`` under ``prefix``.

    Deadlines are generous: these tests check results, and a shared 2-core machine must
    not turn a correct read into a deadline miss.
    """
    fields: dict[str, object] = {
        "exists_deadline_s": 10.0,
        "get_deadline_s": 30.0,
        "set_deadline_s": 30.0,
        "model": "test-model",
        "weights_fingerprint": WEIGHTS,
        **kw,
    }
    return SGLangBackendOptions(
        nas_path=str(nas_dir),
        s3_endpoint=s3.url,
        s3_bucket="kvtest",
        s3_prefix=prefix,
        s3_region=s3.region,
        **fields,  # type: ignore[arg-type]
    )


def unique_prefix() -> str:
    return f"sg-{uuid.uuid4().hex[:12]}/"


def host_pool(
    layout: str = "page_first", pages: int = 32, storage_format_tag: str | None = None
) -> MHAHostPoolReplica:
    return MHAHostPoolReplica(
        size=pages * PAGE,
        page_size=PAGE,
        layer_num=3,
        head_num=2,
        head_dim=8,
        layout=layout,
        storage_format_tag=storage_format_tag,
    )


def create_backend(
    opts: SGLangBackendOptions,
    pool: MHAHostPoolReplica,
    *,
    tp_rank: int = 0,
    register: bool = True,
    **storage: Any,
):
    """A backend as SGLang attaches it, as rank ``tp_rank`` of 2 (``storage`` overrides
    fields of SGLang's storage config, and may change that)."""
    return attach(
        opts,
        pool,
        **({"tp_rank": tp_rank, "tp_size": 2} | storage),
        model_name="org/test-model",
        register=register,
    )


def sglang_keys(n_pages: int, salt: str | None = None, first: int = 0) -> list[str]:
    """SGLang's own storage page keys for a prompt of ``n_pages`` pages."""
    from sglang.srt.mem_cache.utils import get_hash_str, storage_namespace_seed

    tokens = list(range(first, first + n_pages * PAGE))
    return get_hash_str(tokens, storage_namespace_seed(None, salt), page_size=PAGE)


@contextlib.contextmanager
def backends(nas_dir: Path, s3: S3Endpoint, prefix: str) -> Iterator[Callable[..., Any]]:
    """``make(pool=None, *, tp_rank=0, register=True, storage={}, **options)``: a backend
    on ``nas_dir`` and ``s3`` under ``prefix``, as a fresh SGLang process attaches it (with
    ``storage`` overriding SGLang's storage config); all closed on exit.

    The secrets must be in the environment already (:func:`backend_env`).
    """
    made: list[Any] = []

    def make(pool: MHAHostPoolReplica | None = None, **kw: Any) -> Any:
        tp_rank, register = int(kw.pop("tp_rank", 0)), bool(kw.pop("register", True))
        storage = dict(kw.pop("storage", {}))
        opts = options(nas_dir, s3, prefix, **kw)
        backend = create_backend(
            opts, pool or host_pool(), tp_rank=tp_rank, register=register, **storage
        )
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            backend.close()
