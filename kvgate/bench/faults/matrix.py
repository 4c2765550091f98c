"""The faults ``kvgate bench faults`` injects, one at a time, and how each one ends.

A *held* fault lasts :data:`HELD_S` and is then healed (the S3 proxy answers again, the
NAS is writable again, the worker is thawed); its end is the heal. An *instant* fault
(a kill, a restart, a corruption) ends when it is done; a killed process is then started
again, as Kubernetes would, and the time that took is reported as ``restart_s``.
``kills`` names what the fault kills (a worker, a gateway replica): requests in flight on
it may fail, no others may. ``back`` names what is seen serving again once the fault is
over: the worker or replica hit (by its usage rows), or the tier (restores from it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import boto3
import httpx
import psutil

from kvgate.bench.faults.stack import GATEWAYS, WORKERS, Child, FaultStack
from tiering.tierd import PASS_LOCK
from tiering.tiers.nas_files import SUFFIX

#: seconds a held fault lasts
HELD_S = 30.0
#: the most objects the S3 corruption rewrites (each is a GET and a PUT)
MAX_CORRUPT_OBJECTS = 400

Notes = dict[str, object]


@dataclass(frozen=True)
class Fault:
    """One fault: what it does, how it is undone, what it may kill."""

    name: str
    what: str
    inject: Callable[[FaultStack], Notes]
    heal: Callable[[FaultStack], object] | None = None
    held: bool = False
    #: the child it kills, whose in-flight requests may fail
    kills: str = ""
    #: a worker id, gateway name or tier that must be seen serving again after the end
    back: str = ""
    #: waits for the moment to inject (a worker streaming, a tierd pass running)
    moment: Callable[[FaultStack], Notes] | None = None
    needs_mount: bool = False


def _nothing(_stack: FaultStack) -> Notes:
    return {}


def _wait_busy(url: str, deadline_s: float = 15.0) -> bool:
    """Until the worker at ``url`` runs a request (at most ``deadline_s``): whether it does."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            loads = httpx.get(f"{url}/v1/loads", timeout=2).json()["loads"]
            if sum(r.get("num_running_reqs", 0) for r in loads):
                return True
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.05)  # polling the worker's load: the kill waits for a stream
    return False


def _child(stack: FaultStack, name: str) -> Child:
    return (stack.workers | stack.gateways | {"tierd": stack.tierd})[name]


def _kill(name: str) -> Callable[[FaultStack], Notes]:
    def kill(stack: FaultStack) -> Notes:
        pid = _child(stack, name).serving_pid()
        sent = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        return {"killed_pid": pid, "died_after_s": round(time.monotonic() - sent, 3)}

    return kill


def _wait_dead(pid: int, deadline_s: float = 30.0) -> None:
    """Until ``pid`` has exited (gone, or a zombie its parent has not reaped yet): the
    kernel takes a while to tear a process down, and its sockets live until then."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.005)  # polling the process table


def _streaming(name: str) -> Callable[[FaultStack], Notes]:
    def wait(stack: FaultStack) -> Notes:
        return {"mid_stream": _wait_busy(_child(stack, name).probe_url.rsplit("/", 1)[0])}

    return wait


def _restart(name: str) -> Callable[[FaultStack], None]:
    return lambda stack: _child(stack, name).restart()


def _in_a_pass(stack: FaultStack, deadline_s: float = 60.0) -> Notes:
    """Until a tierd pass runs (it holds :data:`PASS_LOCK` in Postgres for its length)."""

    async def poll() -> bool:
        conn = await asyncpg.connect(stack.site.dsn)
        try:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end:
                if await conn.fetchval(_PASS_RUNNING, PASS_LOCK >> 32, PASS_LOCK & 0xFFFFFFFF):
                    return True
                await asyncio.sleep(0.01)  # polling the lock table
            return False
        finally:
            await conn.close()

    return {"mid_pass": asyncio.run(poll())}


_PASS_RUNNING = """
SELECT count(*) > 0 FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND classid::bigint = $1 AND objid::bigint = $2
"""


def _signal_worker(sig: signal.Signals) -> Callable[[FaultStack], Notes]:
    def send(stack: FaultStack) -> Notes:
        pid = stack.workers[WORKERS[1]].serving_pid()
        os.kill(pid, sig)
        return {"pid": pid}

    return send


def _proxy(**fault: object) -> Callable[[FaultStack], Notes]:
    def set_fault(stack: FaultStack) -> Notes:
        stack.set_proxy_fault(**fault)
        return dict(fault)

    return set_fault


def _restart_postgres(stack: FaultStack) -> Notes:
    started = time.monotonic()
    stack.restart_postgres()
    return {"restart_s": round(time.monotonic() - started, 2)}


def _read_only(on: bool) -> Callable[[FaultStack], Notes]:
    def remount(stack: FaultStack) -> Notes:
        stack.nas.read_only(on)
        return {}

    return remount


def _fill(stack: FaultStack) -> Notes:
    return {"filler_bytes": stack.nas.fill()}


def _flip(data: bytes) -> bytes:
    """``data`` with one byte in the middle inverted (in the payload, past the header)."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _corrupt_nas(stack: FaultStack) -> Notes:
    damaged = 0
    for path in stack.nas.path.rglob(f"*{SUFFIX}"):
        try:
            with open(path, "r+b") as block:
                data = block.read()
                block.seek(0)
                block.write(_flip(data))
        except FileNotFoundError:  # demoted or deleted meanwhile
            continue
        damaged += 1
    return {"blocks_corrupted": damaged}


def _corrupt_objects(stack: FaultStack) -> Notes:
    """Rewrite objects with a byte flipped, straight in SeaweedFS (not through the proxy)."""
    s3 = boto3.client(
        "s3",
        endpoint_url=stack.s3.url,
        aws_access_key_id=stack.s3.access_key,
        aws_secret_access_key=stack.s3.secret_key,
        region_name=stack.s3.region,
    )
    damaged = 0
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=stack.bucket, Prefix=stack.site.s3_prefix
    )
    for page in pages:
        for item in page.get("Contents", ()):
            if damaged >= MAX_CORRUPT_OBJECTS:
                return {"objects_corrupted": damaged}
            try:
                data = s3.get_object(Bucket=stack.bucket, Key=item["Key"])["Body"].read()
            except s3.exceptions.NoSuchKey:  # tierd deleted it meanwhile
                continue
            s3.put_object(Bucket=stack.bucket, Key=item["Key"], Body=_flip(data))
            damaged += 1
    return {"objects_corrupted": damaged}


FAULTS: tuple[Fault, ...] = (
    Fault("none", "no fault: the control (how much differs with nothing injected)", _nothing),
    Fault(
        "worker_kill",
        f"kill -9 of worker {WORKERS[0]}'s engine while it streams; then restarted",
        _kill(WORKERS[0]),
        moment=_streaming(WORKERS[0]),
        heal=_restart(WORKERS[0]),
        kills=WORKERS[0],
        back=WORKERS[0],
    ),
    Fault(
        "worker_freeze",
        f"worker {WORKERS[1]}'s engine frozen (SIGSTOP) for {HELD_S:g} s, then SIGCONT",
        _signal_worker(signal.SIGSTOP),
        heal=_signal_worker(signal.SIGCONT),
        held=True,
        back=WORKERS[1],
    ),
    Fault("postgres_restart", "pg_ctl restart -m fast (every session cut)", _restart_postgres),
    Fault(
        "s3_down",
        f"the S3 endpoint refuses connections for {HELD_S:g} s (open ones cut)",
        _proxy(down=True),
        heal=lambda stack: stack.set_proxy_fault(),
        held=True,
        back="object",
    ),
    Fault(
        "s3_503_slow",
        f"for {HELD_S:g} s S3 answers every 2nd request 503 SlowDown and the rest 2 s late",
        _proxy(error_every=2, delay_s=2.0),
        heal=lambda stack: stack.set_proxy_fault(),
        held=True,
        back="object",
    ),
    Fault(
        "nas_read_only",
        f"the NAS remounted read-only for {HELD_S:g} s",
        _read_only(True),
        heal=_read_only(False),
        held=True,
        needs_mount=True,
    ),
    Fault(
        "nas_full",
        f"the NAS filled to the last byte for {HELD_S:g} s",
        _fill,
        heal=lambda stack: stack.nas.unfill(),
        held=True,
        needs_mount=True,
    ),
    Fault("nas_corrupt", "one byte flipped in every block on the NAS", _corrupt_nas),
    Fault(
        "s3_corrupt",
        f"one byte flipped in (up to {MAX_CORRUPT_OBJECTS}) objects in the bucket",
        _corrupt_objects,
    ),
    Fault(
        "tierd_kill",
        "kill -9 of tierd in the middle of a pass (while it holds the pass lock); then restarted",
        _kill("tierd"),
        moment=_in_a_pass,
        heal=_restart("tierd"),
        kills="tierd",
    ),
    Fault(
        "gateway_kill",
        f"kill -9 of gateway replica {GATEWAYS[0]} (of two); then restarted",
        _kill(GATEWAYS[0]),
        heal=_restart(GATEWAYS[0]),
        kills=GATEWAYS[0],
        back=GATEWAYS[0],
    ),
)
