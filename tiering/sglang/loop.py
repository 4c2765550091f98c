"""A synchronous caller's bridge to asyncio code: an event loop in a thread, and a guard.

SGLang calls its storage backend synchronously from several threads; the tiered store is
asyncio code. :class:`LoopThread` runs one event loop in a daemon thread and lets any
thread run a coroutine there with a deadline. :func:`never_raises` turns every exception
of a method into a fallback answer, counted and logged at a bounded rate, because an
exception raised into SGLang's threads would take the scheduler down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from tiering.failures import FailureLog

T = TypeVar("T")


class Guarded(Protocol):
    """What :func:`never_raises` needs from the object whose methods it wraps."""

    failures: FailureLog

    def count(self, name: str, n: int = 1) -> None: ...


class LoopThread:
    """An asyncio event loop running in its own daemon thread; callable from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait up to ``timeout`` s (cancelling it past that)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"tier call did not finish within {timeout:g} s") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def never_raises(
    fallback: Callable[..., Any],
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Turn any exception of the wrapped method into ``fallback(self, *args)``, counted and logged."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def guarded(self: Guarded, *args: Any, **kwargs: Any) -> T:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # SGLang's threads must never see an exception from us
                self.count(f"{method.__name__}_failed")
                self.failures.record("sglang", method.__name__, exc)
                return fallback(self, *args)

        return guarded

    return wrap
