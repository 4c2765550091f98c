"""The tiered store behind our SGLang storage backend, opened from its extra config.

:class:`~tiering.sglang.backend.KvgateHiCacheStorage` keeps pages in the same
:class:`~tiering.store.TieredStore` the built-in engine uses: host RAM (``host_bytes``),
the shared NAS, the object store and the ledger. This module turns
:class:`~tiering.sglang.options.SGLangBackendOptions` and the secrets in the environment
into that store. The clients it opens (S3, the ledger's pool) are the store's resources,
so ``store.close()`` releases them.

The costs are set so that the store never second-guesses SGLang, which has its own
prefetch policy: whatever SGLang asks for is fetched, bounded by the backend's deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import asyncpg

from protocol.tiers import TierName
from tiering.cost import CostConfig, CostModel
from tiering.failures import FailureLog
from tiering.ledger import Ledger
from tiering.sglang.options import (
    DATABASE_URL_ENV,
    S3_ACCESS_KEY_ENV,
    S3_SECRET_KEY_ENV,
    SGLangBackendOptions,
)
from tiering.store import StoreConfig, TieredStore
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier, default_read_threads
from tiering.tiers.object import ObjectConfig, ObjectTier

log = logging.getLogger("kvgate.tiering.sglang")


async def open_store(o: SGLangBackendOptions, failures: FailureLog) -> TieredStore:
    """The started store for options ``o``; ledger connection failures go to ``failures``.

    Raises FileNotFoundError when the NAS directory is missing (a mount problem the
    operator must see at launch). Without ``DATABASE_URL``, or when Postgres cannot be
    reached, the store runs without the ledger: lookups fall back to the NAS itself.
    """
    nas_root = Path(o.nas_path)
    if not nas_root.is_dir():
        raise FileNotFoundError(
            f"NAS directory {nas_root} does not exist: mount the shared NAS there "
            "or point nas_path in the backend's extra config at it"
        )
    async with contextlib.AsyncExitStack() as stack:
        obj = await ObjectTier(
            ObjectConfig(
                endpoint_url=o.s3_endpoint,
                bucket=o.s3_bucket,
                prefix=o.s3_prefix,
                region=o.s3_region,
                access_key=os.environ.get(S3_ACCESS_KEY_ENV),
                secret_key=os.environ.get(S3_SECRET_KEY_ENV),
            )
        ).start()
        stack.push_async_callback(obj.close)
        ledger = await _ledger(stack, failures)
        if o.nas_max_bytes and ledger is None:
            log.warning("no KV ledger: the NAS cap of %d bytes is not enforced", o.nas_max_bytes)
        deadline = o.get_deadline_s
        cost = CostModel(
            CostConfig(
                margin=0.0,
                prior_prefill_tokens_per_s=1e-9,
                deadline_s={
                    TierName.HOST: deadline,
                    TierName.NAS: deadline,
                    TierName.OBJECT: deadline,
                },
            )
        )
        nas = NasTier(NasConfig(root=nas_root, threads=o.nas_threads or default_read_threads()))
        stack.callback(nas.close)  # its reader threads
        store = TieredStore(
            HostTier(o.host_bytes),
            nas=nas,
            obj=obj,
            ledger=ledger,
            cost=cost,
            config=StoreConfig(
                write_queue_pages=o.write_queue_pages,
                # Half the caller's deadline, so a slow ledger still leaves time to ask the NAS.
                ledger_timeout_s=o.exists_deadline_s / 2,
                nas_max_bytes=o.nas_max_bytes if ledger is not None else 0,
            ),
            resources=stack.pop_all(),
        )
    return await store.start()


async def _ledger(stack: contextlib.AsyncExitStack, failures: FailureLog) -> Ledger | None:
    """The ledger on ``DATABASE_URL`` (its pool closed by ``stack``), or None."""
    dsn = os.environ.get(DATABASE_URL_ENV)
    if not dsn:
        log.warning("%s is not set: running without the KV ledger", DATABASE_URL_ENV)
        return None
    try:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        # Lookups fall back to the NAS itself; the ledger catches up via tierd.
        failures.record("ledger", "connect", exc)
        return None
    stack.push_async_callback(pool.close)
    return Ledger(pool)
