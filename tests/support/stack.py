"""Running ``kvgate up`` as an operator does: a real process, its output read line by line."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from kvgate.stack.ports import free_port
from tests.support.commands import kvgate_env


class Lines:
    """The lines a child prints, collected by a thread so the test can wait with a deadline."""

    def __init__(self, stream) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, deadline_s: float) -> str:
        """The first line matching ``pattern``; fails at the deadline or at end of output."""
        deadline = time.monotonic() + deadline_s
        for line in self.seen:
            if re.search(pattern, line):
                return line
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"output ended before {pattern!r}; got {self.seen}")
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        pytest.fail(f"no line matching {pattern!r} within {deadline_s:.0f}s; got {self.seen}")


def processes_referencing(home: Path) -> list[str]:
    """Live processes of that stack: ``home`` in their command line (postgres -D, weed
    -dir=...) or as the KVGATE_HOME they inherited (every child of ``kvgate up``)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            inherited = proc.environ().get("KVGATE_HOME") == str(home)
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            inherited = False
        if inherited or any(str(home) in arg for arg in cmdline):
            found.append(" ".join(cmdline))
    return found


def start_up(home: Path, *args: str, **env: str) -> tuple[subprocess.Popen[str], Lines]:
    """``kvgate up [args]`` on free ports, serving the seeded tiny random model (loads in a
    second)."""
    for name in ("GATEWAY_PORT", "WORKER_PORT", "TIERD_METRICS_PORT", "PROMETHEUS_PORT"):
        env.setdefault(f"KVGATE_{name}", str(free_port()))
    env.setdefault("KVGATE_WORKER_MODEL", "tiny-random")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "up", *args],
        env=kvgate_env(home, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, Lines(proc.stdout)
