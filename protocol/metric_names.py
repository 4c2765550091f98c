"""Names of the worker metrics that others read: the gateway's dashboard and the benchmarks.

A worker exports them on ``/metrics``; the staff dashboard scrapes them like any Prometheus
server, and ``kvgate bench`` waits on them, so the names are written once, here.
"""

#: every worker metric starts so; an unlabelled one is a plain gauge (queue, pool use)
WORKER_PREFIX = "kvgate_worker_"

#: per-tier figures: ``kvgate_worker_tier_<TierStats field>{tier="host"}`` and the two below
TIER_PREFIX = WORKER_PREFIX + "tier_"

#: tiered-store events (writes, hits, misses, drops), labelled by ``event``
TIER_STORE_EVENTS = TIER_PREFIX + "store_events"

#: tier operations that failed and became misses, labelled by ``tier`` and ``kind``
TIER_FAILURES = TIER_PREFIX + "failures"

#: evicted pages not yet written behind to the NAS
TIER_WRITE_QUEUE = TIER_PREFIX + "write_queue_pages"
