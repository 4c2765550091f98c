"""Names of the worker metrics that others read: the gateway's dashboard and the benchmarks.

A worker exports them on ``/metrics``; the staff dashboard scrapes them like any Prometheus
server, and ``kvgate bench`` waits on them, so the names are written once, here.
"""

#: every worker metric starts so; an unlabelled one is a plain gauge (queue, pool use)
WORKER_PREFIX = "kvgate_worker_"

#: per-tier figures: ``kvgate_worker_tier_<figure>{tier="host"}`` (see :data:`TIER_FIGURES`)
TIER_PREFIX = WORKER_PREFIX + "tier_"

#: tiered-store events (writes, hits, misses, drops), labelled by ``event``
TIER_STORE_EVENTS = TIER_PREFIX + "store_events_total"

#: tier operations that failed and became misses, labelled by ``tier`` and ``kind``
TIER_FAILURES = TIER_PREFIX + "failures_total"

#: evicted pages not yet written behind to the NAS
TIER_WRITE_QUEUE = TIER_PREFIX + "write_queue_pages"

#: each per-tier figure the worker exports (a ``TierStats`` field) -> the metric's name after
#: :data:`TIER_PREFIX`: counters end in ``_total``, levels name their unit
TIER_FIGURES: dict[str, str] = {
    "hits": "hits_total",
    "misses": "misses_total",
    "bytes_read": "read_bytes_total",
    "bytes_written": "written_bytes_total",
    "puts": "puts_total",
    "deletes": "deletes_total",
    "corruptions": "corruptions_total",
    "used_bytes": "used_bytes",
    "items": "pages",
}

#: seconds spent reading restores from each tier (with read bytes: the restore bandwidth)
TIER_FETCH_SECONDS = TIER_PREFIX + "fetch_seconds_total"

#: evicted pages the write-behind dropped because its queue was full
TIER_WRITE_DROPPED = TIER_PREFIX + "write_dropped_pages_total"
