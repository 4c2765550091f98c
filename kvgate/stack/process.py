"""A stack part that is a child process: command line, environment, readiness probe, log file.

Every long-running service of ``kvgate up`` (SeaweedFS, tierd, the worker under its
agent, the gateway) is one ``ProcessPart``. The child runs in a session of its
own, so a Ctrl-C in the terminal reaches only the supervisor, which then stops the
children in order; on Linux the child also gets SIGTERM if the supervisor itself dies
without cleaning up, so a ``kill -9`` of ``kvgate up`` does not leave services running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx
import psutil

from kvgate.stack.supervisor import PartError, Ready

Probe = Callable[[], Ready | None]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """Have the kernel SIGTERM this process when its parent dies (``preexec_fn`` on Linux:
    runs in the child between fork and exec)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def http_probe(url: str, ready: Ready) -> Probe:
    """A probe that reports ``ready`` once ``GET url`` answers with a 2xx status."""

    def probe() -> Ready | None:
        response = httpx.get(url, timeout=2.0)
        return ready if response.is_success else None

    return probe


def log_line_probe(log_path: Path, pattern: str) -> Probe:
    """A probe for services without HTTP: ready once ``log_path`` gains a line matching
    ``pattern`` (a regex) after this probe was made; the line is the reported address."""
    offset = log_path.stat().st_size if log_path.exists() else 0
    regex = re.compile(pattern, re.MULTILINE)

    def probe() -> Ready | None:
        with open(log_path, "rb") as log:
            log.seek(offset)
            match = regex.search(log.read().decode(errors="replace"))
        return Ready(match.group(0).strip()) if match else None

    return probe


def kvgate_argv(*args: str) -> list[str]:
    """The command line running ``kvgate <args>`` with this very interpreter."""
    return [sys.executable, "-m", "kvgate", *args]


class ProcessPart:
    """A child process that is ready when ``probe`` says so and is stopped with SIGTERM.

    Its output (stdout and stderr) goes to ``log_path``. It inherits this process's
    environment plus the exports of the parts started before it plus ``env``.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        probe: Probe,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        self.name = name
        self._argv = list(argv)
        self._probe = probe
        self._log_path = log_path
        self._env = dict(env or {})
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        """The command line the child runs."""
        return list(self._argv)

    def start(self, env: Mapping[str, str]) -> None:
        """Spawn the child in its own session with its output appended to the log file."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._log.write(f"=== {stamp} kvgate up starts: {' '.join(self._argv)}\n".encode())
        self._log.flush()
        try:
            self._proc = subprocess.Popen(
                self._argv,
                env={**os.environ, **env, **self._env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as exc:
            raise PartError(f"cannot run {self._argv[0]}: {exc}") from exc

    def probe(self) -> Ready | None:
        """Ask the probe, after checking that the child is still alive."""
        why = self.failure()
        if why is not None:
            raise PartError(why)
        return self._probe()

    def failure(self) -> str | None:
        """Why the child is gone (exit code and the end of its log), or ``None`` while it runs."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return (
            f"process exited with code {self._proc.returncode}; "
            f"last lines of {self._log_path}:\n{self._log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM the child's process group, SIGKILL whatever is left after the timeout.

        "Whatever is left" includes the child's descendants that run in sessions of their
        own (a supervisor child such as ``kvgate agent`` starts its engine that way), which
        the group signal does not reach: they are noted before the SIGTERM, and those
        still running once the child is gone are killed, so that none is orphaned.
        """
        if self._proc is not None:
            descendants = self._descendants()
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(self._stop_timeout)
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
            for process in descendants:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()  # psutil checks it is still the same process first
        if self._log is not None:
            self._log.close()

    def _descendants(self) -> list[psutil.Process]:
        assert self._proc is not None
        try:
            return psutil.Process(self._proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return None if self._proc is None else self._proc.pid

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):  # the whole group is already gone
            os.killpg(self._proc.pid, sig)

    def _log_tail(self, lines: int = 8) -> str:
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])


class LateProcessPart:
    """A part whose child process is only decided when it starts (free ports picked then, a
    configuration file written then): subclasses build it in :meth:`process`."""

    name: str

    def __init__(self) -> None:
        self._process: ProcessPart | None = None

    def process(self, env: Mapping[str, str]) -> ProcessPart:
        """The child to run, built now."""
        raise NotImplementedError

    def start(self, env: Mapping[str, str]) -> None:
        """Build the child and spawn it."""
        self._process = self.process(env)
        self._process.start(env)

    def probe(self) -> Ready | None:
        """The child's probe, once it runs."""
        assert self._process is not None
        return self._process.probe()

    def failure(self) -> str | None:
        """Why the child exited, if it did."""
        return None if self._process is None else self._process.failure()

    def stop(self) -> None:
        """SIGTERM the child (SIGKILL after the stop timeout)."""
        if self._process is not None:
            self._process.stop()
