"""``kvgate bench sglang``: our SGLang storage backend, driven as SGLang drives it.

Pages shaped like SmolLM2-135M's at SGLang's recommended 64 tokens per page (30 layers x
K/V x 64 tokens x 3 heads x 64, bf16 = 1.4 MiB) sit in a replica of SGLang's page-first
host pool. The backend is attached through SGLang's own factory and timed on its zero-copy
calls: ``batch_set_v1`` until the pages are on the NAS with their ledger rows, and
``batch_get_v1`` on a fresh backend (another worker: nothing staged in its process) until
every page is verified and copied into the host pool. The same bytes are written and read
as plain files in the same directory with the same thread count, fsync included, as the
raw device figure. ``batch_exists`` is timed on 128-page chains, the batch SGLang queries.
Postgres is the configured one, else an embedded PostgreSQL started for the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from kvgate.bench.hicache_pool import MHAHostPoolReplica, attach
from kvgate.bench.output import publish
from kvgate.settings import load_settings
from kvgate.stack.postgres import database
from kvgate.wiring.database import migrate_database
from tiering.sglang.options import DATABASE_URL_ENV, SGLangBackendOptions

PAGE_TOKENS = 64
GEOMETRY = {"layer_num": 30, "head_num": 3, "head_dim": 64}
THREADS = 8  # the NAS tier's thread pool
CHAIN = 128  # pages per SGLang storage query (its STORAGE_BATCH_SIZE)
#: stands in for the weights fingerprint: the pages are random, no model computed them
BENCH_WEIGHTS = "sha256:" + hashlib.sha256(b"kvgate bench sglang: random pages").hexdigest()


@dataclass(frozen=True)
class Plan:
    pages: int
    reps: int
    lookups: int


QUICK = Plan(pages=32, reps=3, lookups=99)
FULL = Plan(pages=96, reps=7, lookups=490)


def _keys(n: int) -> list[str]:
    """Fresh SGLang-style page keys (hex SHA-256), so every run writes new pages."""
    return [uuid.uuid4().hex * 2 for _ in range(n)]


def _raw_write(directory: Path, pages: list[bytes]) -> None:
    def one(i: int) -> None:
        tmp, final = directory / f".{i}.tmp", directory / f"{i}.bin"
        with open(tmp, "wb") as f:
            f.write(pages[i])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(len(pages))))


def _raw_read(directory: Path, dst: np.ndarray) -> None:
    def one(i: int) -> None:
        with open(directory / f"{i}.bin", "rb", buffering=0) as f:
            f.readinto(memoryview(dst[i]))

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(len(dst))))


def measure(nas_dir: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Write and restore GB/s through the backend and raw, and exists latency."""
    options = SGLangBackendOptions(
        nas_path=str(nas_dir), model="bench", weights_fingerprint=BENCH_WEIGHTS,
        get_deadline_s=120, set_deadline_s=120, exists_deadline_s=30,
        write_queue_pages=plan.pages,
    )  # fmt: skip
    src = MHAHostPoolReplica(size=2 * plan.pages * PAGE_TOKENS, page_size=PAGE_TOKENS, **GEOMETRY)
    idx = src.alloc(plan.pages * PAGE_TOKENS)
    src.fill_random(idx, seed=0)
    out = src.alloc(plan.pages * PAGE_TOKENS)
    pages = [src.page_bytes(int(i)) for i in idx[::PAGE_TOKENS]]
    n_bytes = sum(len(p) for p in pages)
    raw_dir = nas_dir / "raw"
    raw_dir.mkdir()
    dst = np.empty((plan.pages, len(pages[0])), dtype=np.uint8)
    best = {"write": float("inf"), "raw_write": float("inf")}
    best |= {"restore": float("inf"), "raw_read": float("inf")}
    lookups: list[float] = []
    writer = attach(options, src)
    try:
        for rep in range(plan.reps + 1):  # rep 0 warms up and is not counted
            keys = _keys(plan.pages)
            timed: dict[str, float] = {}
            t = time.perf_counter()
            if writer.batch_set_v1(keys, idx) != [True] * plan.pages:
                raise click.ClickException("the backend refused pages; see its log")
            writer.flush()
            timed["write"] = time.perf_counter() - t
            t = time.perf_counter()
            _raw_write(raw_dir, pages)
            timed["raw_write"] = time.perf_counter() - t
            reader = attach(options, src)  # another worker: nothing staged in its process
            try:
                # Nothing is in the reader's process yet: every query goes to the ledger.
                chain = keys + _keys(CHAIN - len(keys))
                for _ in range(plan.lookups // plan.reps if rep else 0):
                    t = time.perf_counter()
                    if reader.batch_exists(chain) != len(keys):
                        raise click.ClickException("batch_exists miscounted the stored pages")
                    lookups.append(time.perf_counter() - t)
                t = time.perf_counter()
                if reader.batch_get_v1(keys, out) != [True] * plan.pages:
                    raise click.ClickException("the backend missed pages it had stored")
                timed["restore"] = time.perf_counter() - t
                t = time.perf_counter()
                _raw_read(raw_dir, dst)
                timed["raw_read"] = time.perf_counter() - t
            finally:
                reader.close()
            if rep:
                best = {k: min(v, timed[k]) for k, v in best.items()}
            say(
                f"rep {rep}: "
                + ", ".join(f"{k} {n_bytes / v / 1e9:.2f} GB/s" for k, v in timed.items())
            )
        if [src.page_bytes(int(i)) for i in out[::PAGE_TOKENS]] != pages:
            raise click.ClickException("restored pages differ from the stored ones")
    finally:
        writer.close()
    gbps = {k: n_bytes / v / 1e9 for k, v in best.items()}
    return {
        "page_bytes": len(pages[0]),
        "pages": plan.pages,
        "write_gbps": gbps["write"],
        "raw_write_gbps": gbps["raw_write"],
        "write_ratio": gbps["write"] / gbps["raw_write"],
        "restore_gbps": gbps["restore"],
        "raw_read_gbps": gbps["raw_read"],
        "restore_ratio": gbps["restore"] / gbps["raw_read"],
        "exists_p50_ms": statistics.median(lookups) * 1e3,
        "exists_p99_ms": float(np.percentile(lookups, 99)) * 1e3,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }


def render(f: dict[str, Any]) -> str:
    """The figures as the Markdown report."""
    return "\n".join(
        [
            "# SGLang storage backend (`kvgate bench sglang`)",
            "",
            f"{f['pages']} pages of {f['page_bytes'] / 2**20:.2f} MiB (SmolLM2-135M geometry, "
            f"{PAGE_TOKENS} tokens, bf16), zero-copy calls, NAS = a local directory; "
            f"{f['cpus']} CPUs, 1-minute load average {f['load_avg_1m']:.1f} during the run.",
            "",
            "| path | backend GB/s | raw GB/s | ratio |",
            "| --- | --- | --- | --- |",
            f"| write (`batch_set_v1` + write-behind to NAS + ledger) | {f['write_gbps']:.2f} "
            f"| {f['raw_write_gbps']:.2f} | {f['write_ratio']:.2f} |",
            f"| restore (`batch_get_v1` from NAS, verified, into the host pool) "
            f"| {f['restore_gbps']:.2f} | {f['raw_read_gbps']:.2f} | {f['restore_ratio']:.2f} |",
            "",
            f"`batch_exists` on a {CHAIN}-page chain (ledger lookup): "
            f"p50 {f['exists_p50_ms']:.2f} ms, p99 {f['exists_p99_ms']:.2f} ms.",
            "",
        ]
    )


@click.command()
@click.option("--quick", is_flag=True, help="32 pages, 3 repetitions (under a minute).")
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    help="Write the figures as JSON here (a written report gets them beside it anyway).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None,
    help="Markdown report path; default docs/benchmarks/sglang.md on a full run, none with --quick.",
)  # fmt: skip
def sglang(quick: bool, json_path: Path | None, out: Path | None) -> None:
    """Write and restore GB/s of the SGLang backend vs plain files; exists latency."""
    settings = load_settings()
    url = settings.database_url.get_secret_value() if settings.database_url else None
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-sglang-") as tmp:
        scratch = Path(tmp)
        with database(url, scratch / "pg") as dsn:
            asyncio.run(migrate_database(dsn))
            os.environ[DATABASE_URL_ENV] = dsn  # where the backend, inside SGLang, finds it
            (scratch / "nas").mkdir()
            figures = measure(
                scratch / "nas", QUICK if quick else FULL, lambda m: click.echo(m, err=True)
            )
    publish(
        render(figures),
        figures,
        out=out,
        json_path=json_path,
        default_out=Path("docs/benchmarks/sglang.md"),
        quick=quick,
    )
