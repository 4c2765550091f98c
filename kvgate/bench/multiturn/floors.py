"""What this machine allows: the floors the restore and no-reuse figures are held against.

A restore figure compares the TTFT of a turn whose history comes from a tier with the same
turn resident in L1. Whatever the tier, its bytes must reach the pool: from the NAS's page
cache or host RAM that is at least one pass over memory, from the object store at least one
transfer of them over HTTP. Measured in the same run, beside the figures:

- ``memory_copy_bytes_per_s``: one copy of a history's bytes, spread over as many threads
  as the machine has cores (as the NAS reads are), the best of :data:`TRIES`;
- ``object_get_bytes_per_s``: one GET of a history's bytes stored as a single object,
  through the object tier's own read path (signed GET, checksum), the best of
  :data:`TRIES`: what storing a history as one object, not an object per page, would give
  with this client and store (not a floor: parallel ranged GETs or a leaner client could
  beat it);
- ``nas_page_write_cpu_s``: CPU seconds (user and system) the NAS's writer spends per page
  (temporary file, write, fsync as configured, rename), the median of :data:`TRIES` rounds
  of :data:`WRITE_PAGES` pages: what write-through costs the cores per page before any
  bookkeeping.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kvgate.bench.multiturn import stack
from kvgate.bench.multiturn.report import RESTORE_HISTORY
from kvgate.bench.multiturn.sizing import PAGE_TOKENS
from kvgate.settings import load_settings
from kvgate.stack.seaweed import S3Endpoint
from tiering.codec import make_block
from tiering.keys import Namespace
from tiering.tiers.base import TierError
from tiering.tiers.nas_files import write_block
from tiering.tiers.object import ObjectConfig, ObjectTier

#: tries per floor: the best copy or GET (the machine's own speed, not its noise), the
#: median write round
TRIES = 5
#: pages written per round of the write floor
WRITE_PAGES = 64


def memory_copy_rate(nbytes: int, threads: int | None = None) -> float:
    """Bytes/s of one copy of ``nbytes`` between two buffers, split over ``threads`` (the
    cores by default); numpy releases the GIL while it copies."""
    threads = threads or os.cpu_count() or 1
    src = np.ones(nbytes, dtype=np.uint8)  # written once: every page is backed, not shared-zero
    dst = np.ones(nbytes, dtype=np.uint8)
    bounds = [nbytes * t // threads for t in range(threads + 1)]

    def part(t: int) -> None:
        np.copyto(dst[bounds[t] : bounds[t + 1]], src[bounds[t] : bounds[t + 1]])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(TRIES):
            start = time.perf_counter()
            list(pool.map(part, range(threads)))
            best = min(best, time.perf_counter() - start)
    return nbytes / best


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def page_write_cpu(
    folder: Path, page_bytes: int, *, fsync: bool, pages: int = WRITE_PAGES
) -> float:
    """CPU seconds per page of writing ``pages`` blocks of ``page_bytes`` as NAS files under
    ``folder`` (then deleted), as the NAS tier writes them; the median of :data:`TRIES`."""
    ns = Namespace(tenant="floors", model=uuid.uuid4().hex, dtype="float16", page_size=1)
    payload = np.ones(page_bytes // 2, dtype=np.float16)
    rounds = []
    with tempfile.TemporaryDirectory(dir=folder, prefix="write-floor-") as root:
        for r in range(TRIES):
            blocks = [
                make_block(key, ns.digest, "float16", payload.shape, payload)
                for key in ns.page_keys(list(range(r * pages, (r + 1) * pages)))
            ]
            start = _cpu_seconds()
            for block in blocks:
                write_block(root, block, fsync=fsync, chunk=page_bytes + 4096)
            rounds.append((_cpu_seconds() - start) / pages)
    return statistics.median(rounds)


async def _object_get_rate(endpoint: S3Endpoint, bucket: str, nbytes: int) -> float:
    config = ObjectConfig(
        endpoint_url=endpoint.url,
        bucket=bucket,
        prefix=f"floors-{uuid.uuid4().hex[:8]}/",
        access_key=endpoint.access_key,
        secret_key=endpoint.secret_key,
        region=endpoint.region,
    )
    ns = Namespace(tenant="floors", model=uuid.uuid4().hex, dtype="float16", page_size=1)
    (key,) = ns.page_keys([0])
    payload = np.ones(nbytes // 2, dtype=np.float16)
    block = make_block(key, ns.digest, "float16", payload.shape, payload)
    async with ObjectTier(config) as tier:
        await tier.put_many([block])
        try:
            best = float("inf")
            for _ in range(TRIES):
                start = time.perf_counter()
                (got,) = await tier.get_many([key])
                best = min(best, time.perf_counter() - start)
                if got is None:
                    raise RuntimeError(f"the floor's object {tier.object_name(key)} vanished")
                del got
        finally:
            await tier.delete_many([key])
    return nbytes / best


def object_get_rate(endpoint: S3Endpoint, bucket: str, nbytes: int) -> float:
    """Bytes/s of one GET of ``nbytes`` stored as one object in ``bucket`` (then deleted),
    through the object tier's read path; the best of :data:`TRIES`."""
    return asyncio.run(_object_get_rate(endpoint, bucket, nbytes))


def measure(
    *, history_bytes: int, page_bytes: int, nas_folder: Path, fsync: bool,
    s3: S3Endpoint | None, bucket: str,
) -> dict[str, Any]:  # fmt: skip
    """Every floor this machine has (the object one only with an object store)."""
    out: dict[str, Any] = {
        "history_bytes": history_bytes,
        "page_bytes": page_bytes,
        "memory_copy_bytes_per_s": memory_copy_rate(history_bytes),
        "nas_page_write_cpu_s": page_write_cpu(nas_folder, page_bytes, fsync=fsync),
    }
    if s3 is not None:
        out["object_get_bytes_per_s"] = object_get_rate(s3, bucket, history_bytes)
    return out


def for_restore(svc: stack.Services, kv: int, restore: dict[str, Any]) -> dict[str, Any]:
    """The floors for a run's restore turn: a history of as many bytes as its NAS restore
    moved (``kv`` bytes a token), pages of the restore workers' size, written where the
    run's NAS directories are, with the NAS's fsync setting. A floor that cannot be measured
    is reported as such (``{"error": ...}``), not raised: the figures stand without it."""
    nas = restore.get(str(RESTORE_HISTORY), {}).get("nas", {})
    tokens = nas.get("cached_tokens") or RESTORE_HISTORY
    try:
        return measure(
            history_bytes=tokens * kv,
            page_bytes=PAGE_TOKENS * kv,
            nas_folder=svc.root,
            fsync=load_settings().tier_nas_fsync,
            s3=svc.s3,
            bucket=stack.BUCKET,
        )
    except (OSError, RuntimeError, TierError) as exc:
        return {"error": f"the floors were not measured: {exc}"}
