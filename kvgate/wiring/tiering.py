"""Map :class:`~kvgate.settings.Settings` onto the tiering package's own config types.

``tiering`` never reads kvgate settings; the commands that run it (``kvgate tierd``, the
worker, ``kvgate bench tiers``) build its configs here, in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from kvgate.settings import Settings
from kvgate.stack.postgres import create_pool
from protocol.tiers import TierName
from tiering.cost import CostConfig, CostModel
from tiering.ledger import Ledger
from tiering.store import StoreConfig, TieredStore
from tiering.tierd import TierdConfig
from tiering.tiers.host import HostTier
from tiering.tiers.nas import NasConfig, NasTier
from tiering.tiers.object import ObjectConfig, ObjectTier

if TYPE_CHECKING:  # torch-side types; imported for real only by tiered_offload()
    from workers.engine.kv_pool import KVLayout
    from workers.engine.tiered_offload import TieredOffload


def nas_config(s: Settings) -> NasConfig:
    """The NAS directory and its write policy."""
    return NasConfig(s.nas_dir, fsync=s.tier_nas_fsync)


def object_config(s: Settings) -> ObjectConfig | None:
    """The object store, or None when no S3 endpoint is configured."""
    if not s.s3_endpoint:
        return None
    return ObjectConfig(
        endpoint_url=s.s3_endpoint,
        bucket=s.s3_bucket,
        prefix=s.s3_prefix,
        access_key=s.s3_access_key.get_secret_value(),
        secret_key=s.s3_secret_key.get_secret_value(),
        region=s.s3_region,
        max_concurrency=s.tier_object_concurrency,
        max_attempts=s.tier_object_max_attempts,
        read_timeout=s.tier_object_timeout_s,
    )


def store_config(s: Settings) -> StoreConfig:
    """Queues and timeouts of a worker's tiered store."""
    return StoreConfig(
        write_queue_pages=s.tier_write_queue_pages,
        ledger_timeout_s=s.tier_ledger_timeout_s,
        nas_max_bytes=s.tier_nas_max_bytes,
    )


def cost_config(s: Settings) -> CostConfig:
    """Per-tier deadlines (the priors stay the package defaults)."""
    return CostConfig(
        deadline_s={
            TierName.HOST: 1.0,
            TierName.NAS: s.tier_deadline_nas_s,
            TierName.OBJECT: s.tier_deadline_object_s,
        }
    )


def tierd_config(s: Settings) -> TierdConfig:
    """The limits tierd enforces."""
    return TierdConfig(
        nas_high_bytes=s.tier_nas_high_bytes,
        nas_low_bytes=min(s.tier_nas_low_bytes, s.tier_nas_high_bytes),
        object_max_bytes=s.tier_object_max_bytes,
        retention_s=s.tier_retention_s,
        namespace_quota_bytes=s.tier_namespace_quota_bytes,
        orphan_grace_s=s.tierd_orphan_grace_s,
        interval_s=s.tierd_interval_s,
        watermark_check_s=s.tierd_watermark_check_s,
        reconcile_interval_s=s.tierd_reconcile_interval_s,
    )


async def build_store(
    settings: Settings, dsn: str | None, tiers: Collection[str] | None = None
) -> TieredStore:
    """A worker's tiered store: host RAM, the lower ``tiers``, and the ledger when ``dsn``.

    ``tiers`` picks from ``nas`` and ``object`` (``host`` is always there: it is the spill
    path); by default every configured one: the NAS, and S3 when an endpoint is set. Named
    explicitly, ``object`` must be configured. The ledger is used whenever a shared tier
    is, so that workers find each other's pages; its pool opens lazily (``min_size=0``) so
    that a worker starts, and serves by recompute, while Postgres is down. Everything
    opened here is closed by ``store.close()``.
    """
    from workers.engine.pinned import host_copy_in  # torch: only workers build stores

    obj_cfg = object_config(settings)
    if tiers is None:
        tiers = (TierName.NAS, TierName.OBJECT) if obj_cfg is not None else (TierName.NAS,)
    stack = contextlib.AsyncExitStack()
    nas = obj = ledger = None
    if TierName.NAS in tiers:
        settings.nas_dir.mkdir(parents=True, exist_ok=True)
        nas = NasTier(nas_config(settings))
        stack.callback(nas.close)
    if TierName.OBJECT in tiers:
        if obj_cfg is None:
            raise ValueError("the object tier needs an S3 endpoint (KVGATE_S3_ENDPOINT)")
        obj = ObjectTier(obj_cfg)
        stack.push_async_callback(obj.close)
    if dsn and (nas is not None or obj is not None):
        pool = await create_pool(dsn, min_size=0, max_size=4)
        stack.push_async_callback(pool.close)
        ledger = Ledger(pool)
    return TieredStore(
        HostTier(settings.tier_host_bytes, copy_in=host_copy_in()),
        nas=nas,
        obj=obj,
        ledger=ledger,
        cost=CostModel(cost_config(settings)),
        config=store_config(settings),
        resources=stack,
    )


def tiered_offload(
    settings: Settings,
    dsn: str | None,
    *,
    tiers: Collection[str] | None = None,
    model_fingerprint: str,
    layout: KVLayout,
    compute: str,
    prefill_stats: Callable[[], tuple[int, float]] | None = None,
) -> TieredOffload:
    """The engine's ``offload=`` for the built-in worker, wired from ``settings``.

    ``tiers`` and ``dsn`` choose the store's lower tiers and ledger, as in :func:`build_store`;
    ``model_fingerprint``, ``layout`` and ``compute`` (the engine's compute dtype and device
    type) scope the keys of its pages.
    """
    from workers.engine.tiered_offload import TieredOffload

    return TieredOffload(
        lambda: build_store(settings, dsn, tiers),
        model_fingerprint=model_fingerprint,
        layout=layout,
        compute=compute,
        fetch_timeout_s=max(settings.tier_deadline_nas_s, settings.tier_deadline_object_s) + 1.0,
        prefill_stats=prefill_stats,
        write_through=settings.tier_write_through,
    )
