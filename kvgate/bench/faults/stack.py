"""The stack a fault run starts, with a handle on every process a fault acts on.

Postgres (embedded) and SeaweedFS are those of ``kvgate bench multiturn``
(:func:`kvgate.bench.multiturn.stack.services`); in front of SeaweedFS runs the fault
proxy (:mod:`kvgate.bench.faults.proxy`), and every S3 client of the stack is pointed at
it. The NAS is a tmpfs of its own size when this process may mount one (root, or
CAP_SYS_ADMIN), so that it can really be made read-only and really fill up; otherwise a
plain directory, and the two faults that need the mount are reported as not run. tierd,
two workers under ``kvgate agent`` (each the other's fallback, splitting the cores) and two
gateway replicas are :class:`Child` processes that a fault may kill, freeze or restart.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.multiturn import stack as bench_stack
from kvgate.models.registry import served_model_id
from kvgate.stack.ports import free_port
from kvgate.stack.postgres import restart_embedded_postgres
from kvgate.stack.process import ProcessPart, kvgate_argv
from kvgate.stack.seaweed import S3Endpoint
from protocol.metric_names import TIER_FAILURES, TIER_FIGURES, TIER_PREFIX

WORKERS = ("fault-a", "fault-b")
GATEWAYS = ("gateway-1", "gateway-2")
#: the tmpfs holds this many times the NAS high watermark: tierd keeps it well below full
NAS_ROOM = 4
#: the worker counters a phase reports the movement of: metric sample name -> short name
COUNTERS = {
    TIER_PREFIX + TIER_FIGURES["corruptions"]: "corruptions",
    TIER_FAILURES: "failures",
}


@dataclass(frozen=True)
class Sizes:
    """Tier sizes of a run, in bytes (small, so that every tier is used all the time)."""

    kv_pool: int
    host: int
    nas_high: int
    object_max: int


@dataclass
class Child:
    """One process of the stack that a fault may kill, freeze or restart."""

    name: str
    argv: list[str]
    probe_url: str
    env: dict[str, str]
    log_dir: Path
    part: ProcessPart | None = None

    def start(self) -> None:
        """Start it and wait until its probe answers."""
        self.part = bench_stack.start_process(
            self.name, self.argv, self.probe_url, self.log_dir, self.env
        )

    def stop(self) -> None:
        """SIGTERM (SIGKILL after a minute) and reap, whatever state it is in."""
        if self.part is not None:
            with contextlib.suppress(ProcessLookupError):
                self.signal_all(signal.SIGCONT)  # a frozen process cannot stop
            self.part.stop()
            self.part = None

    def restart(self) -> None:
        """What a supervisor (Kubernetes) does after it died: reap it, start it again."""
        self.stop()
        self.start()

    @property
    def pid(self) -> int:
        assert self.part is not None and self.part.pid is not None
        return self.part.pid

    def serving_pid(self) -> int:
        """The process that serves: a worker's engine under its agent, else the child."""
        for proc in psutil.Process(self.pid).children(recursive=True):
            if "kvgate.bench.multiturn.worker" in " ".join(proc.cmdline()):
                return proc.pid
        return self.pid

    def signal_all(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child and every descendant."""
        procs = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)


class Nas:
    """The NAS directory; a size-limited tmpfs when mounting is allowed here."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.filler = path / ".fill"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "kvgate-faults-nas", str(path)],
            capture_output=True,
            text=True,
        )
        self.mounted = done.returncode == 0
        self.why_not = "" if self.mounted else (done.stderr.strip() or "mount failed")

    def read_only(self, on: bool) -> None:
        """Remount read-only (``on``) or read-write: writes fail with EROFS meanwhile."""
        mode = "ro" if on else "rw"
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)

    def fill(self) -> int:
        """Write a filler file until the file system is full (ENOSPC); its bytes."""
        chunk, written = b"\0" * (1 << 20), 0
        with open(self.filler, "wb") as out:
            try:
                while True:
                    written += out.write(chunk)
                    out.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return written

    def unfill(self) -> None:
        """Delete the filler file."""
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        """Lazily unmount (whatever still has files open lets go later)."""
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)


@dataclass
class FaultStack:
    """Everything a fault acts on, and where the load goes."""

    site: bench_stack.Site
    pg_dir: Path
    s3: S3Endpoint
    bucket: str
    proxy_control: str
    nas: Nas
    proxy: Child
    tierd: Child
    workers: dict[str, Child] = field(default_factory=dict)
    gateways: dict[str, Child] = field(default_factory=dict)
    model: str = ""
    api_key: str = ""

    @property
    def gateway_urls(self) -> list[str]:
        return [g.probe_url.rsplit("/", 1)[0] for g in self.gateways.values()]

    def children(self) -> list[Child]:
        """Every child, in the order they are stopped."""
        return [*self.gateways.values(), *self.workers.values(), self.tierd, self.proxy]

    def stop_children(self) -> None:
        for child in self.children():
            child.stop()

    def set_proxy_fault(self, **fault: object) -> None:
        """Set the proxy's fault (no arguments: none)."""
        httpx.put(f"{self.proxy_control}/fault", json=fault, timeout=30).raise_for_status()

    def restart_postgres(self) -> None:
        restart_embedded_postgres(self.pg_dir)

    def worker_counters(self) -> dict[str, float]:
        """The workers' tier corruption and failure counters, summed over the workers
        (``corruptions{tier=nas}``, ``failures{tier=object,kind=read}``...); a worker
        that does not answer adds nothing."""
        total: dict[str, float] = {}
        for worker in self.workers.values():
            try:
                text = httpx.get(worker.probe_url.replace("/health", "/metrics"), timeout=5).text
            except httpx.HTTPError:
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in COUNTERS:
                        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                        name = f"{COUNTERS[sample.name]}{{{labels}}}"
                        total[name] = total.get(name, 0.0) + sample.value
        return total


def _child(name: str, argv: list[str], probe_url: str, env: dict[str, str], logs: Path) -> Child:
    child = Child(name, argv, probe_url, env, logs)
    child.start()
    return child


@contextlib.contextmanager
def fault_stack(root: Path, model_spec: str | None, sizes: Sizes) -> Iterator[FaultStack]:
    """Start the whole stack under ``root`` serving ``model_spec`` (``KVGATE_WORKER_MODEL``;
    None: the default model); stop it (and unmount the NAS) when the block ends."""
    logs = root / "logs"
    with contextlib.ExitStack() as held:
        svc = held.enter_context(bench_stack.services(root))
        assert svc.s3 is not None
        port, control = free_port(), free_port()
        proxy_argv = [
            sys.executable, "-m", "kvgate.bench.faults.proxy", "--upstream", svc.s3.url,
            "--port", str(port), "--control-port", str(control),
        ]  # fmt: skip
        proxy = _child("s3-proxy", proxy_argv, f"http://127.0.0.1:{control}/fault", {}, logs)
        held.callback(proxy.stop)
        via_proxy = S3Endpoint(
            f"http://127.0.0.1:{port}", svc.s3.access_key, svc.s3.secret_key, svc.s3.region
        )
        cores = max(1, (os.cpu_count() or 1) // len(WORKERS))
        site = bench_stack.new_site(
            bench_stack.Services(svc.dsn, via_proxy, svc.root),
            "faults",
            worker_kv_pool_bytes=sizes.kv_pool,
            tier_host_bytes=sizes.host,
            tier_nas_high_bytes=sizes.nas_high,
            tier_nas_low_bytes=sizes.nas_high // 2,
            tier_object_max_bytes=sizes.object_max,
            tierd_interval_s=1.0,
            **({"worker_model": model_spec} if model_spec else {}),
        )
        site = replace(site, env=site.env | {"OMP_NUM_THREADS": str(cores)})
        nas = Nas(site.nas, sizes.nas_high * NAS_ROOM)
        held.callback(nas.unmount)
        stack = FaultStack(
            site, root / "pg", svc.s3, bench_stack.BUCKET, f"http://127.0.0.1:{control}",
            nas, proxy, tierd=_tierd(site, logs), model=served_model_id(model_spec),
        )  # fmt: skip
        held.callback(stack.stop_children)
        for wid in WORKERS:
            wport = free_port()
            argv = bench_stack.registered_worker_argv(wid, "host,nas,object", stack.model, wport)
            stack.workers[wid] = _child(
                wid, argv, f"http://127.0.0.1:{wport}/health", site.env, logs
            )
        for name in GATEWAYS:
            gport = free_port()
            env = {**site.env, "KVGATE_GATEWAY_PORT": str(gport)}
            url = f"http://127.0.0.1:{gport}/readyz"
            stack.gateways[name] = _child(name, kvgate_argv("gateway"), url, env, logs)
        stack.api_key = bench_stack.api_key(site)
        yield stack


def _tierd(site: bench_stack.Site, logs: Path) -> Child:
    port = free_port()
    env = {**site.env, "KVGATE_TIERD_METRICS_PORT": str(port)}
    return _child("tierd", kvgate_argv("tierd"), f"http://127.0.0.1:{port}/metrics", env, logs)
