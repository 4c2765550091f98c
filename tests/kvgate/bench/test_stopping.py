"""A benchmark stopped from outside leaves none of the services it started running.

``kvgate bench multiturn --compare`` starts Postgres and SeaweedFS of its own; a SIGTERM
(a time limit, a supervisor) unwinds it like Ctrl-C, and even a SIGKILL, which runs no
cleanup at all, takes SeaweedFS down with it (the kernel signals it when its parent dies).
Postgres, a daemon of ``pg_ctl`` rather than a child, outlives a SIGKILL: the test stops
whatever postmaster the benchmark left in its scratch directory.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.commands import kvgate_env


def _weed_under(proc: subprocess.Popen[bytes], deadline_s: float = 120.0) -> psutil.Process:
    """The ``weed`` process the benchmark started, once it runs."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the benchmark ended before starting SeaweedFS"
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "weed" in child.name():
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)  # polling for a process to appear: there is nothing to wait on
    raise AssertionError(f"no weed process under the benchmark within {deadline_s:.0f} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_benchmark_leaves_no_seaweedfs_behind(sig: signal.Signals) -> None:
    home = Path(tempfile.mkdtemp(prefix="kvbench-stop-")) / "home"
    argv = [sys.executable, "-m", "kvgate", "bench", "multiturn", "--compare", "--quick"]
    proc = subprocess.Popen(
        [*argv, "--configs", "object", "--json", str(home.parent / "out.json")],
        # the benchmark's scratch directory (Postgres' data among it) under the test's own
        env=kvgate_env(home, KVGATE_WORKER_MODEL="tiny-random", TMPDIR=str(home.parent)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=home.parent,
    )
    try:
        weed = _weed_under(proc)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs([weed], timeout=30)
        assert alive == [], f"SeaweedFS {weed.pid} still runs after the benchmark got {sig.name}"
    finally:
        if proc.poll() is None:
            proc.kill()
        _stop_postmasters_under(home.parent)


def _stop_postmasters_under(root: Path) -> None:
    """Stop the postmasters whose data directory is under ``root`` (what a SIGKILL left)."""
    left = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and "-D" in cmd and str(root) in " ".join(cmd):
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.parent() is None or proc.parent().name() != "postgres":
                    proc.terminate()
                    left.append(proc)
    psutil.wait_procs(left, timeout=30)
