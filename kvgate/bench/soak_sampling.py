"""What ``kvgate bench soak`` samples: per process of the stack, its memory and descriptors;
the bytes the NAS (its files) and the object store (a listing of the bucket) hold.

Memory is sampled per process as well as summed per part, so that a part can be judged by
the processes that lived through the run (:mod:`kvgate.bench.soak_verdicts`). Postgres' is
its anonymous memory (``Anonymous`` in ``smaps_rollup``: its heap, catalog and plan caches),
not USS: a page of the shared buffer cache counts as private to the last backend that maps
it, so a backend's USS rises when others exit, with nothing allocated.

The bucket is listed while holding tierd's pass lock. A listing is many requests, and a pass
that trims old objects and uploads new ones between them would be counted half before and
half after: the store held 64.00 MiB whenever a sample did not overlap a pass, and such
listings read up to 64.03 MiB against its 64 MiB limit. Under the lock the listing is one
state of the store, which only tierd's passes change.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from kvgate.bench.soak_verdicts import JUDGED_MEMORY, Samples
from kvgate.settings import Settings
from tiering.tierd import PASS_LOCK

#: per part, what is summed over its processes
FIGURES = ("rss", "pss", "fds", "procs")


def part_of(proc: psutil.Process) -> str | None:
    """Which part of the stack ``proc`` is, from its command line."""
    cmd = " ".join(proc.cmdline())
    if "postgres" in proc.name() or "postgres" in cmd.split(" ")[0]:
        return "postgres"
    if "weed" in proc.name():
        return "s3"
    match = re.search(r"-m kvgate (up|tierd|agent|worker|gateway)\b", cmd)
    return match.group(1) if match else None


def anonymous_bytes(pid: int) -> int:
    """The anonymous (not file-backed, not shared-memory) resident bytes of process ``pid``."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return 0


def _stack_processes(up: psutil.Process, home: Path) -> list[psutil.Process]:
    """``kvgate up`` and its descendants, and the embedded Postgres (a daemon of ``pg_ctl``,
    so not a descendant: found by its data directory) with its backends."""
    procs = [up, *up.children(recursive=True)]
    for proc in psutil.process_iter(["cmdline"]):
        if str(home / "pg") in " ".join(proc.info["cmdline"] or []):
            procs += [proc, *proc.children(recursive=True)]
    return list({p.pid: p for p in procs}.values())


def sample(
    up: psutil.Process, home: Path, bucket: Callable[[], int], samples: Samples, t0: float
) -> None:
    """Append one sample of every part, the NAS and the bucket to ``samples``."""
    sums: dict[str, dict[str, int]] = {}
    judged: dict[str, dict[str, int]] = {}
    for proc in _stack_processes(up, home):
        try:
            part = part_of(proc)
            if part is None:
                continue
            mem = proc.memory_full_info()
            got = {"rss": mem.rss, "pss": mem.pss, "fds": proc.num_fds()}
            figure = JUDGED_MEMORY.get(part, "rss")
            own = anonymous_bytes(proc.pid) if figure == "anon" else got[figure]
        except (psutil.Error, OSError):
            continue  # a process that ended between the listing and the reading
        total = sums.setdefault(part, dict.fromkeys(FIGURES, 0))
        for name, value in {**got, "procs": 1}.items():
            total[name] += value
        judged.setdefault(part, {})[str(proc.pid)] = own
    samples.t.append(time.monotonic() - t0)
    for part, total in sums.items():
        for name in FIGURES:
            getattr(samples, name).setdefault(part, []).append(total[name])
    samples.add_lived(judged)
    nas = home / "nas"
    samples.nas.append(sum(f.stat().st_size for f in nas.rglob("*") if f.is_file()))
    samples.objects.append(bucket())


def bucket_bytes(endpoint: str, dsn: str) -> Callable[[], int]:
    """A function that lists the stack's bucket between tierd's passes and sums its objects'
    sizes (the store's own count, not the ledger's; -1 when the listing fails)."""
    import boto3

    defaults = Settings.model_fields
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=defaults["s3_access_key"].default.get_secret_value(),
        aws_secret_access_key=defaults["s3_secret_key"].default.get_secret_value(),
        region_name=defaults["s3_region"].default,
    )
    pages = client.get_paginator("list_objects_v2")

    def listing() -> int:
        return sum(
            o["Size"]
            for page in pages.paginate(Bucket=defaults["s3_bucket"].default)
            for o in page.get("Contents", [])
        )

    def total() -> int:
        try:
            return between_passes(dsn, listing)
        except Exception:  # S3 or Postgres busy or restarting: a gap in the series
            return -1

    return total


def between_passes(dsn: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, run while holding tierd's pass lock: no pass runs meanwhile (a pass that
    finds the lock taken is skipped, and the next one comes within seconds)."""

    async def locked() -> Any:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", PASS_LOCK)
            try:
                return await asyncio.to_thread(fn)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", PASS_LOCK)
        finally:
            await conn.close()

    return asyncio.run(locked())
