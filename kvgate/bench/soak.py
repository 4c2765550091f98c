"""``kvgate bench soak``: the whole stack under steady multi-turn load for a while, watched.

It runs ``kvgate up`` on a home of its own (small tier limits, so that tierd works all the
time), plays seeded multi-turn conversations through the gateway with a team key, and every
``--interval`` seconds samples the stack (:mod:`kvgate.bench.soak_sampling`): each process'
memory and descriptors, and the bytes the NAS and the object store hold. After a warm-up
(the first two fifths of the run: see :data:`~kvgate.bench.soak_verdicts.WARM_UP_FIFTHS`)
a part's growth is the median of the last fifth against the median of the third, over the
processes that lived through both: a leak shows as growth that does not level off; a tier
over its limit (after the first fifth) shows as samples above it.

Postgres is judged by its anonymous memory, not RSS: a backend's RSS counts every page of
``shared_buffers`` it has touched. Its shared memory is reported beside it (PSS summed: each
shared page counted once). Descriptors are judged per process: the pools open and close
whole backends (~30 files each), which moves the sums without anything leaking.

The load keeps under the team plan's request rate (:data:`LOAD_REQUESTS_PER_MIN`): refused
requests would be the gateway doing its job, not a soak of the stack. tierd
reconciles every minute here, not every ten: its walk of both tiers has the largest
transient footprint of a pass, and reached first after the warm-up it would read as growth.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
import httpx
import psutil

from kvgate.bench.multiturn.driver import Plan, Target, run
from kvgate.bench.multiturn.workload import Shape, conversations
from kvgate.bench.output import cpu_name, publish, source_commit
from kvgate.bench.soak_sampling import FIGURES, bucket_bytes, sample
from kvgate.bench.soak_verdicts import FD_JITTER, GROWTH_LIMIT, LIMITS, MIB, Samples, verdicts
from kvgate.models.registry import served_model_id
from kvgate.stack.ports import free_port
from kvgate.stack.postgres import embedded_postgres

#: small conversations: the soak is about what accumulates, not about throughput
SHAPE = Shape(
    common_prefix=100,
    unique_prefix_mean=300,
    unique_prefix_max=600,
    user_tokens=(20, 40),
    answer_tokens=(8, 16),
    turns=(3, 5),
)
STARTUP_DEADLINE_S = 300.0
#: the load's average rate: 80% of the team plan's 600 requests a minute
LOAD_REQUESTS_PER_MIN = 480


class _Lines:
    """The stack's output, read by a thread so that waiting for a line has a deadline."""

    def __init__(self, stream: Any) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, deadline_s: float) -> str:
        end = time.monotonic() + deadline_s
        while (left := end - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise click.ClickException("the stack exited while starting; see its logs")
            if re.search(pattern, line):
                return line
        raise click.ClickException(f"the stack did not print {pattern!r} in {deadline_s:.0f} s")


def _team_key(env: dict[str, str]) -> str:
    argv = [sys.executable, "-m", "kvgate", "admin"]
    subprocess.run([*argv, "teams", "create", "soak"], env=env, check=True, capture_output=True)
    out = subprocess.run(
        [*argv, "keys", "create", "--team", "soak"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return re.search(r"kvg_\S+", out).group(0)  # type: ignore[union-attr]


def _wait_for_model(gateway: str, key: str, model: str, deadline_s: float) -> None:
    """Poll the gateway's ``/v1/models`` until it lists ``model``: "stack is up" means every
    process answers, not that the worker's registration has reached the gateway yet."""
    end = time.monotonic() + deadline_s
    listed: list[str] = []
    while time.monotonic() < end:
        try:
            r = httpx.get(f"{gateway}/v1/models", headers={"Authorization": f"Bearer {key}"})
            listed = [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []
        except httpx.HTTPError:
            listed = []
        if model in listed:
            return
        time.sleep(0.2)  # a poll interval, not synchronisation: the loop checks the state
    raise click.ClickException(
        f"the gateway did not list model {model!r} within {deadline_s:.0f} s (it lists {listed})"
    )


def _load(gateway: str, key: str, deadline: float, errors: list[str]) -> int:
    """Rounds of seeded conversations until ``deadline``, paced to
    :data:`LOAD_REQUESTS_PER_MIN` on average; the requests played."""
    played, seed, start = 0, 0, time.monotonic()
    while time.monotonic() < deadline:
        convs = conversations(8, SHAPE, seed)
        results = asyncio.run(
            run(Target(gateway, key), convs, Plan(clients=2, active=4), progress=False)
        )
        played += len(results)
        errors += [r.error for r in results if r.error]
        seed += 1
        due = start + played * 60 / LOAD_REQUESTS_PER_MIN  # when this many are due at the rate
        time.sleep(max(0.0, min(due, deadline) - time.monotonic()))  # pacing, not waiting
    return played


#: how the report names the memory figures
_MEMORY = {"rss": "RSS", "anon": "anonymous"}


def _report(data: dict[str, Any]) -> str:
    lines = [
        f"# Soak: {data['minutes']:g} minutes of steady multi-turn load",
        "",
        f"Run on {data['cpu']} ({os.cpu_count()} CPUs), commit `{data['commit']}`, model "
        f"`{data['model']}`; {data['requests']} requests ({len(data['errors'])} failed), "
        f"a sample every {data['interval_s']:g} s; wall time {data['wall_s']:.0f} s. "
        "Growth compares the median of the last fifth of the run with the third fifth "
        "(after a warm-up of two fifths, which SeaweedFS's heap needs to level off; the "
        "growth from the second fifth is shown beside it), summed over the processes that "
        "were there in every sample of both (a pool opening or closing a backend moves a "
        "part's sum, not a process' own memory). A part passes when its memory grew less "
        f"than {GROWTH_LIMIT:.0%} and its descriptors per process did not both gain more "
        f"than {FD_JITTER} and end above the most they reached after warm-up (Postgres' "
        "pools open and close whole backends, ~30 files each, and a server's connections "
        "come and go with the load; fewer descriptors is no leak). The load is paced to "
        f"{LOAD_REQUESTS_PER_MIN} requests a "
        "minute, under the team plan's limit.",
        "",
        "Postgres is judged by its anonymous memory (its processes' heaps), the others by "
        "RSS: a backend's RSS counts each page of the shared buffer cache it has touched, and "
        "its USS each such page no other process maps any more. RSS and PSS growth, summed "
        "over all of a part's processes, are shown for every part. The object store is "
        "listed while holding tierd's pass lock, so that a listing sees one state of the "
        "store, not the two sides of a pass. Workers write nothing that would take the NAS "
        "above its cap; tierd runs a pass every 5 s, checks the NAS against its high "
        "watermark every second between passes, and reconciles every 60 s (600 s by "
        "default) so that its walk of both tiers, the largest footprint of a pass, is inside "
        "the warm-up.",
        "",
        "| part | processes | memory | after warm-up (MiB) | at end (MiB) | growth "
        "| from 2nd fifth | RSS growth | PSS at end (MiB) | PSS growth "
        "| descriptors per process | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for part, v in data["verdicts"]["parts"].items():
        lines.append(
            f"| {part} | {v['processes_judged']} of {v['processes_at_end']} | "
            f"{_MEMORY[v['memory']]} | "
            f"{v['mib_after_warmup']:.1f} | {v['mib_at_end']:.1f} | {v['growth']:+.1%} | "
            f"{v['growth_from_second_fifth']:+.1%} | "
            f"{v['rss_growth']:+.1%} | {v['pss_mib_at_end']:.1f} | {v['pss_growth']:+.1%} | "
            f"{v['fds_change']:+.1f} | {'ok' if v['ok'] else 'GROWS'} |"
        )
    t = data["verdicts"]["tiers"]
    lines += [
        "",
        f"NAS: at most {t['nas_max_mib']:.1f} MiB (cap {LIMITS['nas_max'] / MIB:g} MiB), above "
        f"it in {t['nas_over_limit_share']:.0%} of samples, above tierd's high watermark "
        f"({LIMITS['nas_high'] / MIB:g} MiB) in {t['nas_over_high_share']:.0%}; object store: at most {t['object_max_mib']:.1f} MiB (limit "
        f"{LIMITS['object_max'] / MIB:g} MiB), above it in "
        f"{t['object_over_limit_share']:.0%}. Verdict: {'ok' if t['ok'] else 'OVER'}.",
        "",
    ]
    return "\n".join(lines)


@click.command()
@click.option("--minutes", type=float, default=30.0, show_default=True, help="Load duration.")
@click.option(
    "--interval", type=float, default=10.0, show_default=True, help="Seconds between samples."
)
@click.option(
    "--model", default="tiny-random", show_default=True, help="KVGATE_WORKER_MODEL of the stack."
)
@click.option("--out", type=click.Path(path_type=Path), help="Write the report here.")
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Write the figures here."
)
def soak(
    minutes: float, interval: float, model: str, out: Path | None, json_path: Path | None
) -> None:
    """Run the stack under steady load; report memory, descriptors and tier sizes over time."""
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="kvgate-soak-")) / "home"
    tierd_port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KVGATE_", "DATABASE_URL"))},
        "KVGATE_HOME": str(home),
        "KVGATE_CONFIG": str(home.parent / "absent.toml"),
        "KVGATE_WORKER_MODEL": model,
        "KVGATE_GATEWAY_PORT": str(free_port()),
        "KVGATE_WORKER_PORT": str(free_port()),
        "KVGATE_TIERD_METRICS_PORT": str(tierd_port),
        "KVGATE_TIERD_INTERVAL_S": "5",
        "KVGATE_TIERD_RECONCILE_INTERVAL_S": "60",
        "KVGATE_TIER_NAS_HIGH_BYTES": str(LIMITS["nas_high"]),
        "KVGATE_TIER_NAS_LOW_BYTES": str(LIMITS["nas_low"]),
        "KVGATE_TIER_NAS_MAX_BYTES": str(LIMITS["nas_max"]),
        "KVGATE_TIER_OBJECT_MAX_BYTES": str(LIMITS["object_max"]),
        "KVGATE_WORKER_KV_POOL_BYTES": str(32 * MIB),
        # a host tier that fills within the warm-up: its growth after that would be a leak
        "KVGATE_TIER_HOST_BYTES": str(64 * MIB),
    }
    stack = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "up"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    samples, errors, played = Samples(), [], []
    try:
        lines = _Lines(stack.stdout)
        # "ready  s3  http://host:port bucket=NAME"
        s3 = lines.wait_for(r"^ready  s3  ", STARTUP_DEADLINE_S).split("  ")[2].split()[0]
        gateway = lines.wait_for(r"^ready  gateway  ", STARTUP_DEADLINE_S).split("  ")[2]
        lines.wait_for(r"^stack is up", STARTUP_DEADLINE_S)
        key = _team_key(env)
        _wait_for_model(gateway, key, served_model_id(model), STARTUP_DEADLINE_S)
        up, t0 = psutil.Process(stack.pid), time.monotonic()
        deadline = t0 + minutes * 60
        # a second user of the stack's Postgres: leaving it before the stack stops only takes
        # this process off the server's users, so that the stack's exit still stops it
        with embedded_postgres(home / "pg") as dsn:
            bucket = bucket_bytes(s3, dsn)
            loader = threading.Thread(
                target=lambda: played.append(_load(gateway, key, deadline, errors)), daemon=True
            )
            loader.start()
            while loader.is_alive() or not samples.t:
                sample(up, home, bucket, samples, t0)
                loader.join(timeout=interval)  # the sampling period: waits on the load
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stack.kill()
    data = {
        "minutes": minutes,
        "interval_s": interval,
        "model": model,
        "cpu": cpu_name(),
        "commit": source_commit(),
        "requests": sum(played),
        "errors": errors[:20],
        "limits": LIMITS,
        "samples": {
            "t": samples.t,
            **{figure: getattr(samples, figure) for figure in FIGURES},
            "nas": samples.nas,
            "objects": samples.objects,
            "lived": samples.lived,
        },
        "verdicts": verdicts(samples),
        "wall_s": time.monotonic() - started,
    }
    default = Path("docs") / "benchmarks" / "soak.md"
    publish(
        _report(data), data, out=out, json_path=json_path, default_out=default, quick=minutes < 30
    )
