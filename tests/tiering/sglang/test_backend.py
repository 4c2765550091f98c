"""Our HiCache storage backend, loaded and driven the way SGLang 0.5.23 drives it.

The backend is created through SGLang's own ``StorageBackendFactory`` dynamic path and
called with SGLang's own page keys, on CPU tensors laid out like SGLang's host pool
(``kvgate.bench.hicache_pool.MHAHostPoolReplica``), against the real NAS directory, S3 server and
Postgres ledger of the session.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import torch

pytest.importorskip(
    "sglang.srt.mem_cache.hicache_storage", reason="run scripts/install-sglang-test-deps.sh"
)

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from kvgate.bench.hicache_pool import MHAHostPoolReplica
from kvgate.stack.postgres import create_pool
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
)
from tests.support.tiering import fresh_database
from tiering.ledger import NAS, OBJECT
from tiering.sglang.backend import KvgateHiCacheStorage
from tiering.sglang.options import DATABASE_URL_ENV
from tiering.tierd import Tierd, TierdConfig
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectConfig, ObjectTier

Make = Callable[..., KvgateHiCacheStorage]


@pytest.fixture
def s3_prefix() -> str:
    """This test's key prefix in the ``kvtest`` bucket."""
    return unique_prefix()


@pytest.fixture
def make(
    monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str,
    s3_server: S3Endpoint,
    nas_dir: Path,
    s3_prefix: str,
) -> Iterator[Make]:
    """Backends on this test's NAS dir and S3 prefix; each call is a fresh SGLang process."""
    backend_env(monkeypatch, pg_dsn, s3_server)
    with backends(nas_dir, s3_server, s3_prefix) as _make:
        yield _make


def _pages(pool: MHAHostPoolReplica, indices: torch.Tensor) -> list[bytes]:
    return [pool.page_bytes(int(i)) for i in indices[::PAGE]]


def test_loaded_through_sglangs_factory(make: Make) -> None:
    backend = make()
    assert type(backend) is KvgateHiCacheStorage
    assert isinstance(backend, HiCacheStorage)


def test_generic_interface_round_trip(make: Make) -> None:
    src = host_pool()
    idx = src.alloc(5 * PAGE)
    src.fill_random(idx, seed=1)
    keys = sglang_keys(5, salt="team-a")
    writer = make(src)
    # What HiCacheController._generic_page_set does.
    flat = [src.get_data_page(int(idx[i * PAGE])) for i in range(5)]
    assert writer.batch_set(keys, flat) is True
    writer.flush()
    assert writer.batch_exists(keys) == 5

    dst = host_pool()
    reader = make(dst)  # another worker: nothing staged in its process
    assert reader.batch_exists([*keys, *sglang_keys(1, salt="other")]) == 5
    # What HiCacheController._generic_page_get does.
    got = reader.batch_get(keys, [dst.get_dummy_flat_data_page() for _ in keys])
    assert all(page is not None for page in got)
    out = dst.alloc(5 * PAGE)
    for i, page in enumerate(got):
        dst.set_from_flat_data_page(int(out[i * PAGE]), page)
    assert _pages(dst, out) == _pages(src, idx)
    single = reader.get(keys[2])
    assert single.view(torch.uint8).numpy().tobytes() == src.page_bytes(int(idx[2 * PAGE]))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_zero_copy_round_trip_matches_generic_bytes(make: Make, layout: str) -> None:
    src = host_pool(layout)
    idx = src.alloc(4 * PAGE)
    src.fill_random(idx, seed=2)
    keys = sglang_keys(4, salt=f"zc-{layout}")
    writer = make(src)
    assert writer.batch_set_v1(keys, idx) == [True] * 4
    writer.flush()

    dst = host_pool(layout)
    reader = make(dst)
    out = dst.alloc(4 * PAGE)
    assert reader.batch_get_v1(keys, out) == [True] * 4
    assert _pages(dst, out) == _pages(src, idx)
    # Both interfaces store the flat data page, so either can read the other's pages.
    flat = reader.batch_get(keys[:1], [dst.get_dummy_flat_data_page()])[0]
    assert flat.view(torch.uint8).numpy().tobytes() == src.page_bytes(int(idx[0]))


async def test_pages_reach_the_ledger_and_survive_tierd_demotion_to_s3(
    make: Make,
    monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str,
    s3_server: S3Endpoint,
    nas_dir: Path,
    s3_prefix: str,
) -> None:
    # tierd reconciles the whole ledger against one NAS: give it a ledger of its own.
    async with fresh_database(pg_dsn) as db:
        monkeypatch.setenv(DATABASE_URL_ENV, urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{db}")))
        src = host_pool()
        idx = src.alloc(5 * PAGE)
        src.fill_random(idx, seed=6)
        keys = sglang_keys(5, salt="demote")
        writer = make(src)
        assert writer.batch_set_v1(keys, idx) == [True] * 5
        writer.flush()
        scoped = [writer.scoped_key(k) for k in keys]

        pool = await create_pool(pg_dsn, database=db, min_size=1, max_size=2)
        try:
            rows = await pool.fetch(
                "SELECT key, namespace, tiers FROM kv_ledger WHERE key = ANY($1)", scoped
            )
            assert {r["key"] for r in rows} == set(scoped)
            assert all(
                r["tiers"] == NAS and r["namespace"] == writer.namespace.digest for r in rows
            )

            nas = NasTier(NasConfig(nas_dir))
            obj_config = ObjectConfig(
                endpoint_url=s3_server.url,
                bucket="kvtest",
                prefix=s3_prefix,
                access_key=s3_server.access_key,
                secret_key=s3_server.secret_key,
                region=s3_server.region,
            )
            async with ObjectTier(obj_config) as obj:
                # A NAS high watermark of 1 byte: tierd demotes every page to S3.
                report = await Tierd(pool, nas, obj, TierdConfig(nas_high_bytes=1)).run_pass()
            assert report.demoted == 5 and report.nas_deleted == 5, report
            assert not any(nas.path(k).exists() for k in scoped)
            tiers = await pool.fetch("SELECT tiers FROM kv_ledger WHERE key = ANY($1)", scoped)
            assert [r["tiers"] for r in tiers] == [OBJECT] * 5
        finally:
            await pool.close()

        dst = host_pool()
        reader = make(dst)  # another worker, after demotion: only S3 has the pages
        out = dst.alloc(5 * PAGE)
        assert reader.batch_exists(keys) == 5
        assert reader.batch_get_v1(keys, out) == [True] * 5
        assert _pages(dst, out) == _pages(src, idx)
        assert reader.stats()["store"]["store"].get("hit_object") == 5


def test_a_corrupted_page_is_a_miss(make: Make, nas_dir: Path) -> None:
    src = host_pool()
    idx = src.alloc(3 * PAGE)
    src.fill_random(idx, seed=3)
    keys = sglang_keys(3, salt="corrupt")
    writer = make(src)
    writer.batch_set_v1(keys, idx)
    writer.flush()
    path = NasTier(NasConfig(root=nas_dir)).path(writer.scoped_key(keys[1]))
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x40  # one bit of KV payload
    path.write_bytes(bytes(raw))

    dst = host_pool()
    reader = make(dst)
    out = dst.alloc(3 * PAGE)
    assert reader.batch_get_v1(keys, out) == [True, False, False]
    assert _pages(dst, out)[0] == src.page_bytes(int(idx[0]))
    # The bad page never reached SGLang's memory, and it is gone from the NAS.
    assert set(_pages(dst, out)[1]) == {0}
    assert not path.exists()
    assert reader.batch_exists(keys) == 1


def test_eight_threads_mixed_calls_are_correct(make: Make) -> None:
    pool = host_pool(pages=8 * 12)
    # A queue that never overflows: this test is about concurrency (backpressure has its own).
    backend = make(pool, write_queue_pages=8 * 30 * 6)
    shared_keys = sglang_keys(2, salt="shared")
    shared_src = pool.alloc(2 * PAGE)
    pool.fill_random(shared_src, seed=99)
    work = []
    for t in range(8):
        src, dst = pool.alloc(4 * PAGE), pool.alloc(4 * PAGE)
        pool.fill_random(src, seed=100 + t)
        work.append((sglang_keys(4, salt=f"thread-{t}"), src, dst))
    expected = {
        k: pool.page_bytes(int(i)) for k, i in zip(shared_keys, shared_src[::PAGE], strict=True)
    }
    for keys, src, _ in work:
        expected.update(
            {k: pool.page_bytes(int(i)) for k, i in zip(keys, src[::PAGE], strict=True)}
        )
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(t: int) -> None:
        keys, src, dst = work[t]
        rng = random.Random(t)
        barrier.wait()
        for _ in range(30):
            op = rng.choice(["set", "get", "exists", "shared"])
            if op == "set":
                backend.batch_set_v1(keys, src)
            elif op == "exists":
                n = backend.batch_exists(keys)
                if not 0 <= n <= 4:
                    errors.append(f"thread {t}: exists said {n}")
            elif op == "get":
                ok = backend.batch_get_v1(keys, dst)
                for j, hit in enumerate(ok):
                    if hit and pool.page_bytes(int(dst[j * PAGE])) != expected[keys[j]]:
                        errors.append(f"thread {t}: page {j} has wrong bytes")
            else:
                backend.batch_set_v1(shared_keys, shared_src)
                flat = backend.batch_get(
                    shared_keys, [pool.get_dummy_flat_data_page() for _ in shared_keys]
                )
                for k, page in zip(shared_keys, flat, strict=True):
                    if page is not None and page.view(torch.uint8).numpy().tobytes() != expected[k]:
                        errors.append(f"thread {t}: shared page has wrong bytes")
        if backend.batch_set_v1(keys, src) != [True] * 4:
            errors.append(f"thread {t}: final write refused")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    # Once written behind, every thread's pages are all there and exact.
    backend.flush()
    for keys, _, dst in work:
        assert backend.batch_exists(keys) == 4
        assert backend.batch_get_v1(keys, dst) == [True] * 4
        assert [pool.page_bytes(int(i)) for i in dst[::PAGE]] == [expected[k] for k in keys]


def test_failure_injector_never_raises_into_sglang_threads(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.5")
    pool = host_pool(pages=8 * 6)
    backend = make(pool)
    assert type(backend).__name__ == "HiCacheStorageFailureInjector"
    raised: list[BaseException] = []

    def worker(t: int) -> None:
        keys = sglang_keys(2, salt=f"inject-{t}")
        src, dst = pool_slots[t]
        try:
            for _ in range(20):
                backend.batch_set_v1(keys, src)
                backend.batch_set(keys, [pool.get_data_page(int(i)) for i in src[::PAGE]])
                backend.set(keys[0], pool.get_data_page(int(src[0])))
                backend.exists(keys[0])
                backend.batch_exists(keys)
                hits = backend.batch_get_v1(keys, dst)
                for j, hit in enumerate(hits):
                    assert not hit or pool.page_bytes(int(dst[j * PAGE])) == pool.page_bytes(
                        int(src[j * PAGE])
                    )
                backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
                backend.get(keys[1], pool.get_dummy_flat_data_page())
                backend.get_stats()
        except BaseException as exc:  # the assertion under test: nothing escapes
            raised.append(exc)

    pool_slots = []
    for t in range(6):
        src, dst = pool.alloc(2 * PAGE), pool.alloc(2 * PAGE)
        pool.fill_random(src, seed=200 + t)
        pool_slots.append((src, dst))
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert raised == []
    backend.clear()


def test_unreachable_postgres_never_raises(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://nobody@127.0.0.1:9/none")
    src = host_pool()
    idx = src.alloc(2 * PAGE)
    src.fill_random(idx, seed=5)
    keys = sglang_keys(2, salt="no-ledger")
    backend = make(src)
    assert backend.stats()["failures"].get("ledger.connect") == 1
    assert backend.batch_set_v1(keys, idx) == [True, True]
    backend.flush()
    dst = host_pool()
    reader = make(dst)  # lookups fall back to the NAS itself
    out = dst.alloc(2 * PAGE)
    assert reader.batch_exists(keys) == 2
    assert reader.batch_get_v1(keys, out) == [True, True]
    assert _pages(dst, out) == _pages(src, idx)


def test_a_read_past_its_deadline_is_a_miss(make: Make) -> None:
    src = host_pool()
    idx = src.alloc(2 * PAGE)
    src.fill_random(idx, seed=7)
    keys = sglang_keys(2, salt="deadline")
    writer = make(src)
    writer.batch_set_v1(keys, idx)
    writer.flush()
    dst = host_pool()
    hasty = make(dst, get_deadline_s=0.5, exists_deadline_s=0.5)
    # A hung NAS, as SGLang would meet it: the tier thread is stuck for 5 s.
    hasty._rt.loop.call_soon_threadsafe(time.sleep, 5)
    out = dst.alloc(2 * PAGE)
    assert hasty.batch_get_v1(keys, out) == [False, False]
    assert hasty.batch_exists(keys) == 0
    assert set(_pages(dst, out)[0]) == {0}
    assert hasty.stats()["backend"]["batch_get_v1_failed"] == 1


def test_hybrid_model_pool_calls_answer_nothing_stored(make: Make) -> None:
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    backend = make()
    keys = sglang_keys(2, salt="hybrid")
    transfer = PoolTransfer(name=PoolName.MAMBA, keys=keys, host_indices=torch.arange(2))
    assert backend.batch_exists_v2(keys, [transfer]).kv_hit_pages == 0
    assert backend.batch_set_v2([transfer]) == {PoolName.MAMBA: [False, False]}
    assert backend.batch_get_v2([transfer]) == {PoolName.MAMBA: [False, False]}


def test_a_full_write_queue_refuses_the_batch_tail(make: Make) -> None:
    src = host_pool()
    idx = src.alloc(6 * PAGE)
    src.fill_random(idx, seed=8)
    keys = sglang_keys(6, salt="backpressure")
    backend = make(src, write_queue_pages=2)
    # SGLang stops backing this operation up at the first refused page.
    assert backend.batch_set_v1(keys, idx) == [True, True, False, False, False, False]
    backend.flush()
    assert backend.batch_exists(keys) == 2
    assert backend.stats()["backend"]["pages_dropped"] == 4


def test_calls_before_the_host_pool_is_registered_never_raise(make: Make) -> None:
    backend = make(register=False)
    keys = sglang_keys(2, salt="early")
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, torch.arange(2 * PAGE)) == [False, False]
    assert backend.batch_get_v1(keys, torch.arange(2 * PAGE)) == [False, False]
    assert backend.batch_get(keys) == [None, None]
    assert backend.set(keys[0], torch.zeros(4)) is False


def test_a_missing_nas_fails_the_attach_with_what_to_fix(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    backend_env(monkeypatch, pg_dsn, s3_server)
    opts = options(tmp_path / "not-mounted", s3_server, unique_prefix())
    with pytest.raises(FileNotFoundError, match="mount the shared NAS there"):
        create_backend(opts, host_pool())
