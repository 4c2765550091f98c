"""Map :class:`~kvgate.settings.Settings` onto the tiering package's own config types.

``tiering`` never reads kvgate settings; the commands that run it (``kvgate tierd``, the
worker, ``kvgate bench tiers``) build its configs here, in one place.
"""

from __future__ import annotations

from kvgate.settings import Settings
from tiering.cost import CostConfig
from tiering.store import StoreConfig
from tiering.tierd import TierdConfig
from tiering.tiers.nas import NasConfig
from tiering.tiers.object import ObjectConfig


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
        write_queue_pages=s.tier_write_queue_pages, ledger_timeout_s=s.tier_ledger_timeout_s
    )


def cost_config(s: Settings) -> CostConfig:
    """Per-tier deadlines (the priors stay the package defaults)."""
    return CostConfig(
        deadline_s={"host": 1.0, "nas": s.tier_deadline_nas_s, "object": s.tier_deadline_object_s}
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
    )
