"""Stop strings over streamed text: cut before the first match, never emit any part of one.

The engine works in token ids; stop strings are text, and a stop string can straddle
tokens. :class:`StopScanner` therefore holds back the tail of the text that could still
grow into a stop string, and releases it only once it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopScanner:
    """Feed it text deltas; it returns the text safe to emit and whether a stop string hit."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return ``(emittable, stopped)``.

        When ``stopped`` the emittable text ends right before the earliest stop string and
        the scanner must not be fed again.
        """
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            return out, True
        keep = self._longest_stop_prefix_suffix()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        """The held-back text, once generation ended without a stop string."""
        out, self._pending = self._pending, ""
        return out

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        text = self._pending
        for keep in range(min(len(text), max((len(s) - 1 for s in self._stops), default=0)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self._stops):
                return keep
        return 0
