"""What scopes the pages of our SGLang storage backend, beyond SGLang's own page keys.

SGLang's keys cover the tokens and the tenant's cache salt; which computation wrote the KV
is ours to fold in. Two deployments under one served name may serve other checkpoints (a
rolling upgrade, fine-tune v1 and v2), and host pools may store pages in other formats:
none of them may restore another's pages. Backends are made through SGLang's own factory,
on the session's real NAS directory, S3 server and Postgres ledger (see
``tests/tiering/sglang/test_backend.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "sglang.srt.mem_cache.hicache_storage", reason="run scripts/install-sglang-test-deps.sh"
)

from kvgate.cli.worker_sglang import DRY_RUN_WEIGHTS
from kvgate.stack.seaweed import S3Endpoint
from tests.support.sglang import (
    PAGE,
    backend_env,
    backends,
    create_backend,
    host_pool,
    options,
    sglang_keys,
    unique_prefix,
    weights,
)
from tiering.sglang.backend import KvgateHiCacheStorage

Make = Callable[..., KvgateHiCacheStorage]


@pytest.fixture
def make(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, s3_server: S3Endpoint, nas_dir: Path
) -> Iterator[Make]:
    """Backends sharing this test's NAS dir and S3 prefix, as workers share them."""
    backend_env(monkeypatch, pg_dsn, s3_server)
    with backends(nas_dir, s3_server, unique_prefix()) as _make:
        yield _make


def _stored(
    make: Make, n: int, salt: str, seed: int, pool: Any = None, **backend: object
) -> list[str]:
    """Keys of ``n`` random pages that a backend made with ``backend`` stored from ``pool``
    (default: a host pool of the default geometry) and flushed."""
    src = pool or host_pool()
    idx = src.alloc(n * PAGE)
    src.fill_random(idx, seed=seed)
    keys = sglang_keys(n, salt=salt)
    writer = make(src, **backend)
    assert writer.batch_set_v1(keys, idx) == [True] * n
    writer.flush()
    return keys


def test_tensor_parallel_shards_never_share_pages(make: Make) -> None:
    keys = _stored(make, 2, "tp", seed=4, tp_rank=0)
    assert make(host_pool(), tp_rank=1).batch_exists(keys) == 0
    reader = make(host_pool(), tp_rank=0)
    assert reader.batch_exists(keys) == 2
    # The same prompt from another team: SGLang seeds the chain with the team's cache salt.
    assert reader.batch_exists(sglang_keys(2, salt="tp-other-team")) == 0


def test_decode_context_parallel_ranks_never_share_pages(make: Make) -> None:
    """An MLA model with decode context parallelism: each DCP rank holds its own slice of
    every page, so rank 1 must not restore rank 0's slice; the same rank of another DCP
    group holds the same slice and does."""

    def dcp(tp_rank: int) -> dict[str, object]:
        return {
            "tp_size": 4,
            "is_mla_model": True,
            "dcp_size": 2,
            "dcp_rank": tp_rank % 2,
            "logical_page_size": 2 * PAGE,
        }

    keys = _stored(make, 2, "dcp", seed=5, tp_rank=0, storage=dcp(0))
    assert make(host_pool(), tp_rank=1, storage=dcp(1)).batch_exists(keys) == 0
    assert make(host_pool(), tp_rank=2, storage=dcp(2)).batch_exists(keys) == 2


def test_other_weights_under_one_served_name_never_share_pages(make: Make) -> None:
    """A rolling upgrade: v1 and v2 of a fine-tune, both served as ``test-model``. v2 must
    recompute what v1 stored, never decode on v1's KV."""
    keys = _stored(make, 3, "upgrade", seed=9)  # by v1
    dst = host_pool()
    v2 = make(dst, weights_fingerprint=weights("test-model v2"))
    assert v2.options.model == "test-model"
    out = dst.alloc(3 * PAGE)
    assert v2.batch_exists(keys) == 0
    assert v2.batch_get_v1(keys, out) == [False] * 3
    assert v2.batch_get(keys[:1]) == [None]
    assert set(dst.page_bytes(int(out[0]))) == {0}
    # the pages are there for the weights that computed them: another v1 worker restores them
    assert make(host_pool()).batch_exists(keys) == 3


def test_host_pools_of_another_storage_format_never_share_pages(make: Make) -> None:
    """SGLang's unified host pool tags its page format (``storage_format_tag``); pages of one
    format are never handed to a pool of another, even with the same geometry and name."""
    unified = "unified-token-major"
    keys = _stored(make, 2, "format", seed=10, pool=host_pool(storage_format_tag=unified))
    assert make(host_pool()).batch_exists(keys) == 0
    assert make(host_pool(storage_format_tag=unified)).batch_exists(keys) == 2


def test_workers_that_compute_otherwise_never_share_pages(make: Make) -> None:
    """The same weights computing in float16 instead of SGLang's default (or quantized) write
    other KV: a worker launched with other such flags recomputes, never restores."""
    keys = _stored(make, 2, "compute", seed=11)
    assert make(host_pool(), compute="--dtype=float16").batch_exists(keys) == 0
    assert make(host_pool(), compute="--quantization=fp8").batch_exists(keys) == 0
    assert make(host_pool()).batch_exists(keys) == 2


@pytest.mark.parametrize("fingerprint", ["", "test-model", DRY_RUN_WEIGHTS, "sha256:abc"])
def test_a_backend_that_cannot_name_its_weights_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str,
    s3_server: S3Endpoint,
    nas_dir: Path,
    fingerprint: str,
) -> None:
    backend_env(monkeypatch, pg_dsn, s3_server)
    opts = options(nas_dir, s3_server, unique_prefix(), weights_fingerprint=fingerprint)
    with pytest.raises(ValueError, match="kvgate worker --engine sglang"):
        create_backend(opts, host_pool())
