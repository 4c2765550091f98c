"""The single-machine supervisor behind ``kvgate up``: an explicit list of parts, run in order.

A *part* is one thing the stack needs (Postgres, the migrations, the S3 server, the NAS
directory, and later the gateway, a worker and tierd). Each part starts, is then probed
until it answers (never a fixed sleep), reports the address it serves and the environment
variables later parts need to find it, and stops. The supervisor starts the parts one by
one, watches them while they run, and stops them in reverse order when it is asked to
(Ctrl-C, SIGTERM) or when one of them fails; whatever happens, every part it started is
stopped before it returns.

The concrete parts live in ``kvgate.stack.parts`` (infrastructure) and
``kvgate.stack.process`` (any subprocess with a readiness probe).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Protocol


@dataclass(frozen=True)
class Ready:
    """What a part reports once it answers: where it is, and how later parts find it."""

    address: str
    exports: Mapping[str, str] = field(default_factory=dict)


class PartError(RuntimeError):
    """A part cannot start or stopped working; the message says why and what to fix."""


class Part(Protocol):
    """One piece of the stack. The supervisor calls ``start``, then ``probe`` until it returns
    a ``Ready``, then ``failure`` while the stack runs, and ``stop`` exactly once at the end."""

    name: str

    def start(self, env: Mapping[str, str]) -> None:
        """Begin starting; ``env`` holds the exports of every part started before this one.

        May block for work that has its own end (a migration run); raises ``PartError``
        when starting is impossible."""

    def probe(self) -> Ready | None:
        """``Ready`` once the part answers, ``None`` (or any exception) while it does not yet.

        Raises ``PartError`` when it can never become ready (its process exited)."""

    def failure(self) -> str | None:
        """Why a ready part stopped working, or ``None`` while it is fine."""

    def stop(self) -> None:
        """Stop whatever ``start`` started; safe to call when ``start`` failed halfway."""


class StopRequested(Exception):
    """The operator asked the stack to stop (a signal) before it finished starting."""


@dataclass(frozen=True)
class StackFailure(Exception):
    """A part failed to start or died while running; names the part and the cause."""

    part: str
    cause: str

    def __str__(self) -> str:
        return f"part {self.part!r} failed: {self.cause}"


Echo = Callable[[str], None]


class Stack:
    """Starts ``parts`` in order, watches them, and stops the started ones in reverse order."""

    def __init__(
        self,
        parts: Sequence[Part],
        *,
        ready_timeout: float,
        echo: Echo = print,
        probe_interval: float = 0.1,
    ) -> None:
        names = [p.name for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"part names must be unique, got {names}")
        self._parts = list(parts)
        self._ready_timeout = ready_timeout
        self._echo = echo
        self._interval = probe_interval
        self._started: list[Part] = []
        self.stop_requested = threading.Event()

    def start(self) -> dict[str, str]:
        """Start every part; return the environment their exports add up to.

        Raises ``StackFailure`` naming the part that did not come up, or ``StopRequested``;
        either way the parts already started are still running (call ``stop``)."""
        env: dict[str, str] = {}
        for part in self._parts:
            if self.stop_requested.is_set():
                raise StopRequested
            self._started.append(part)
            try:
                part.start(dict(env))
                ready = self._await_ready(part)
            except StopRequested:
                raise
            except PartError as exc:
                raise StackFailure(part.name, str(exc)) from exc
            except Exception as exc:
                # a library error while starting (initdb failing, say): name the part, keep the cause
                raise StackFailure(part.name, f"{type(exc).__name__}: {exc}") from exc
            env.update(ready.exports)
            self._echo(f"ready  {part.name}  {ready.address}")
        return env

    def _await_ready(self, part: Part) -> Ready:
        deadline = time.monotonic() + self._ready_timeout
        last: Exception | None = None
        while True:
            try:
                ready = part.probe()
            except PartError:
                raise
            except Exception as exc:  # not answering yet: keep the reason for the timeout message
                last, ready = exc, None
            if ready is not None:
                return ready
            if self.stop_requested.is_set():
                raise StopRequested
            if time.monotonic() >= deadline:
                reason = f" (last probe: {type(last).__name__}: {last})" if last else ""
                raise PartError(
                    f"not ready after {self._ready_timeout:.0f}s{reason}; "
                    "see its log under $KVGATE_HOME/logs/ or raise KVGATE_READY_TIMEOUT"
                )
            self.stop_requested.wait(self._interval)

    def watch(self, interval: float = 0.5) -> None:
        """Block until a stop is requested; raise ``StackFailure`` when a part stops working."""
        while not self.stop_requested.wait(interval):
            for part in self._started:
                why = part.failure()
                if why is not None:
                    raise StackFailure(part.name, why)

    def stop(self) -> None:
        """Stop every started part, newest first; a part that fails to stop does not stop the rest."""
        while self._started:
            part = self._started.pop()
            try:
                part.stop()
            except Exception as exc:  # keep stopping the others; say what may be left behind
                self._echo(f"error  {part.name}  could not stop cleanly: {exc}")
            else:
                self._echo(f"stopped  {part.name}")


@contextmanager
def stop_on_signals(event: threading.Event) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set ``event`` instead of interrupting the code.

    The supervisor then finishes the step it is in and stops in order, rather than being
    torn out of a half-done start with children left running. Repeated signals change
    nothing. The handler only sets the event: printing from it could interrupt a print
    in progress and fail with a reentrant-write error in the middle of stopping.
    """

    def handler(_signum: int, _frame: FrameType | None) -> None:
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(stack: Stack, echo: Echo, echo_err: Echo) -> int:
    """Run ``stack`` in the foreground until a signal or a failure; return the exit status.

    0 after a requested stop, 1 when a part failed to start or died. Every started part
    is stopped before this returns.
    """
    with stop_on_signals(stack.stop_requested):
        try:
            stack.start()
            echo("stack is up; Ctrl-C or SIGTERM stops it")
            stack.watch()
            code = 0
        except StopRequested:
            code = 0
        except StackFailure as exc:
            echo_err(f"kvgate up: {exc}; stopping the stack")
            code = 1
        finally:
            stack.stop_requested.set()
            stack.stop()
    return code
